//! Maglev's lookup table (Eisenbud et al., *Maglev: A Fast and Reliable Software Network Load
//! Balancer*, NSDI 2016), weighted, and the walk from a key's entry to its next candidates.

use crate::stable_hash::mix;

/// Maglev's table size by default: a prime, so that every skip visits every entry; 65,537 entries
/// keep each of 100 backends within about 1% of its share.
pub(crate) const DEFAULT_TABLE_SIZE: u32 = 65_537;

/// A Maglev lookup table over members known by a stable id (a [`stable_hash`](crate::algo::stable_hash)
/// of their key) and a weight.
///
/// Each member walks its own permutation of the entries (`offset + j·skip mod M`, both from its id)
/// and the members take turns claiming the next free entry of theirs, each in proportion to its weight,
/// until the table is full. A key's home is the member at entry `hash mod M`: O(1). The table depends
/// only on the set of (id, weight) pairs, never on the order members were given in, so every worker and
/// every instance with the same members builds the same table. When a member leaves, the entries it
/// held go to others and almost all other entries stay as they were (Maglev's minimal disruption).
///
/// ```
/// use duet_balance::algo::{stable_hash, Maglev};
///
/// let members: Vec<(u64, u32)> = ["a", "b", "c"].iter().map(|m| (stable_hash(m), 1)).collect();
/// let table = Maglev::new(&members, 251);
/// let home = table.home(stable_hash("user-42"));
/// assert!(home < 3);
/// // The next candidates for the key, home first, each member once.
/// let walk: Vec<u32> = table.walk(stable_hash("user-42")).collect();
/// assert_eq!(walk.len(), 3);
/// assert_eq!(walk[0], home);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Maglev {
    /// Member indices (as given to [`Maglev::new`]), one per entry; empty when there are no members.
    entries: Vec<u32>,
    members: usize,
}

impl Maglev {
    /// The table of `members`, given as `(id, weight)`, with `size` entries (a prime; at least the
    /// number of members, else some get none). Members of weight 0 get no entry. Costs
    /// O(size · log size) and allocates the table: build it when membership or weights change, never
    /// per request.
    pub fn new(members: &[(u64, u32)], size: u32) -> Self {
        let size = size.max(1) as usize;
        let mut order: Vec<usize> = (0..members.len()).filter(|&m| members[m].1 > 0).collect();
        // The table must not depend on the order members were given in.
        order.sort_by_key(|&m| (members[m].0, members[m].1));
        if order.is_empty() {
            return Self {
                entries: Vec::new(),
                members: members.len(),
            };
        }
        let heaviest = order.iter().map(|&m| members[m].1).max().unwrap_or(1);
        let permutations: Vec<(u64, u64)> = order
            .iter()
            .map(|&m| {
                let id = members[m].0;
                let offset = mix(id) % size as u64;
                let skip = mix(id ^ 0x9e37_79b9_7f4a_7c15) % (size as u64 - 1).max(1) + 1;
                (offset, skip)
            })
            .collect();
        let mut entries = vec![u32::MAX; size];
        // Each member's position in its permutation, advanced by its skip (no division per step).
        let mut next: Vec<u64> = permutations.iter().map(|&(offset, _)| offset).collect();
        let mut credit = vec![0u64; order.len()];
        let mut filled = 0;
        while filled < size {
            for (i, &m) in order.iter().enumerate() {
                // Each turn a member earns its weight relative to the heaviest, and claims an entry
                // per whole unit earned: weights 2:1 claim entries 2:1.
                credit[i] += u64::from(members[m].1);
                while credit[i] >= u64::from(heaviest) && filled < size {
                    credit[i] -= u64::from(heaviest);
                    let skip = permutations[i].1;
                    loop {
                        let entry = next[i] as usize;
                        next[i] += skip;
                        if next[i] >= size as u64 {
                            next[i] -= size as u64;
                        }
                        if entries[entry] == u32::MAX {
                            entries[entry] = m as u32;
                            filled += 1;
                            break;
                        }
                    }
                }
            }
        }
        Self {
            entries,
            members: members.len(),
        }
    }

    /// The member whose entry `key_hash` lands on: the key's home. Panics on a table of no members
    /// ([`Maglev::is_empty`]).
    #[inline]
    pub fn home(&self, key_hash: u64) -> u32 {
        self.entries[self.entry_of(key_hash)]
    }

    /// Whether no member has an entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The members in the order a key tries them: its home, then the member of each following entry
    /// (wrapping), each member once. Neighbouring entries belong to members independently of each
    /// other, so a key's second choice is spread over all the others, and when a member leaves, its
    /// keys go to their own next candidates rather than all to one neighbour.
    pub fn walk(&self, key_hash: u64) -> impl Iterator<Item = u32> + '_ {
        let start = if self.is_empty() {
            0
        } else {
            self.entry_of(key_hash)
        };
        crate::member_walk::each_member_once(&self.entries, self.members, start)
    }

    /// The member of entry `at` (any value: taken modulo the size). For a walk that keeps its own
    /// record of members seen.
    #[inline]
    pub(crate) fn entry(&self, at: usize) -> u32 {
        self.entries[at % self.entries.len()]
    }

    /// The entry `key_hash` lands on.
    #[inline]
    pub(crate) fn entry_of(&self, key_hash: u64) -> usize {
        // Multiply-shift instead of a division: the same spread, no 64-bit divide on the request path.
        ((u128::from(key_hash) * self.entries.len() as u128) >> 64) as usize
    }

    /// How many entries the table has (0 without members).
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stable_hash::stable_hash;

    fn members(n: u32) -> Vec<(u64, u32)> {
        (0..n).map(|i| (stable_hash(&i), 1)).collect()
    }

    fn shares(table: &Maglev, n: usize) -> Vec<usize> {
        let mut counts = vec![0; n];
        for at in 0..table.len() {
            counts[table.entry(at) as usize] += 1;
        }
        counts
    }

    #[test]
    fn entries_split_evenly_and_by_weight() {
        let table = Maglev::new(&members(10), DEFAULT_TABLE_SIZE);
        let counts = shares(&table, 10);
        let (min, max) = (counts.iter().min(), counts.iter().max());
        assert_eq!(counts.iter().sum::<usize>(), 65_537);
        assert!(
            max.zip(min).is_some_and(|(max, min)| max - min <= 1),
            "{counts:?}"
        );
        let weighted = [(stable_hash("a"), 3), (stable_hash("b"), 1)];
        let counts = shares(&Maglev::new(&weighted, DEFAULT_TABLE_SIZE), 2);
        assert!(counts[0].abs_diff(3 * counts[1]) <= 4, "{counts:?}");
    }

    #[test]
    fn the_table_ignores_the_order_members_are_given_in() {
        let mut given = members(7);
        let forward = Maglev::new(&given, 1009);
        given.reverse();
        let backward = Maglev::new(&given, 1009);
        for at in 0..1009 {
            assert_eq!(forward.entry(at), 6 - backward.entry(at));
        }
    }

    #[test]
    fn a_walk_names_every_member_once_home_first() {
        let table = Maglev::new(&members(5), 1009);
        let walk: Vec<u32> = table.walk(99).collect();
        let mut sorted = walk.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [0, 1, 2, 3, 4]);
        assert_eq!(walk[0], table.home(99));
        assert!(Maglev::new(&[], 7).is_empty());
        assert_eq!(Maglev::new(&[], 7).walk(1).count(), 0);
    }
}
