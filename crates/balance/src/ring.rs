//! A hash ring (Karger et al., *Consistent Hashing and Random Trees*, STOC 1997; Envoy's ring hash),
//! weighted, looked up in O(1) through an index of its points, and the walk from a key's point to its
//! next candidates.

use crate::stable_hash::mix;

/// Points per endpoint (of the heaviest weight) by default: shares within about 3%.
pub(crate) const DEFAULT_POINTS: u32 = 1024;

/// A hash ring over members known by a stable id (a [`stable_hash`](crate::algo::stable_hash) of their
/// key) and a weight, the alternative to [`Maglev`](crate::algo::Maglev) for keyed picks.
///
/// Each member places points on a circle of 2⁶⁴ positions, in proportion to its weight (`points` for a
/// member of the heaviest weight), each at a hash of its id and the point's number; a key's home is the
/// member of the first point at or after the key's hash. Unlike Maglev's table, a member's points
/// depend on nothing but its own id and weight (and the heaviest weight): when a member leaves, exactly
/// the keys on its arcs move (each to the next point's member), and when one joins, exactly the keys
/// its new points capture; no other key moves. What it gives up is evenness: a member's share of the
/// circle varies by about `1/√points` (±3% at 1,024 points each), where Maglev's entries differ by one.
///
/// The lookup reads an index of the circle (one bucket per point on average, by the hash's top bits)
/// and then the few points in the key's bucket: O(1), two or three cache lines. Built in
/// O(points · log points) when membership or weights change, never per request.
///
/// ```
/// use duet_balance::algo::{stable_hash, Ring};
///
/// let members: Vec<(u64, u32)> = ["a", "b", "c"].iter().map(|m| (stable_hash(m), 1)).collect();
/// let ring = Ring::new(&members, 100);
/// let home = ring.home(stable_hash("user-42"));
/// // The next candidates for the key, home first, each member once.
/// let walk: Vec<u32> = ring.walk(stable_hash("user-42")).collect();
/// assert_eq!((walk.len(), walk[0]), (3, home));
///
/// // "b" leaves: only the keys "b" had move.
/// let without_b = Ring::new(&[members[0], members[2]], 100);
/// for key in 0..1000u32 {
///     let (before, after) = (ring.home(stable_hash(&key)), without_b.home(stable_hash(&key)));
///     if before != 1 {
///         assert_eq!(after, if before == 0 { 0 } else { 1 }, "key {key} stays");
///     }
/// }
/// ```
#[derive(Debug, Clone, Default)]
pub struct Ring {
    /// The points' positions, ascending.
    hashes: Vec<u64>,
    /// The member (index as given to [`Ring::new`]) of each point.
    owners: Vec<u32>,
    /// `index[b]`: the first point whose position's top bits are `b` or more.
    index: Vec<u32>,
    /// 64 − log₂(index.len()): a position's bucket is `position >> shift`.
    shift: u32,
    members: usize,
}

impl Ring {
    /// The ring of `members`, given as `(id, weight)`: `points` points for a member of the heaviest
    /// weight, and for each other member in proportion to its weight (at least one). Members of weight 0
    /// get no point. The ring depends only on the set of `(id, weight)` pairs, never on their order, so
    /// every worker and every instance with the same members builds the same ring.
    pub fn new(members: &[(u64, u32)], points: u32) -> Self {
        let heaviest = members
            .iter()
            .map(|&(_, w)| u64::from(w))
            .max()
            .unwrap_or(1);
        let mut placed: Vec<(u64, u64, u32)> = Vec::new();
        for (m, &(id, weight)) in members.iter().enumerate() {
            if weight == 0 {
                continue;
            }
            let share = (u64::from(points) * u64::from(weight))
                .div_ceil(heaviest)
                .max(1);
            let seed = mix(id ^ 0x5851_f42d_4c95_7f2d);
            placed.extend((0..share).map(|i| (mix(seed.wrapping_add(i)), id, m as u32)));
        }
        // Ordered by position, then by id: two members' points that collide fall the same way
        // whatever order the members were given in.
        placed.sort_unstable_by_key(|&(position, id, _)| (position, id));
        let buckets = placed.len().next_power_of_two().max(1);
        let shift = 64 - buckets.trailing_zeros();
        let hashes: Vec<u64> = placed.iter().map(|&(position, _, _)| position).collect();
        let mut index = Vec::with_capacity(buckets);
        let mut at = 0;
        for bucket in 0..buckets as u64 {
            while at < hashes.len() && bucket_of(hashes[at], shift) < bucket {
                at += 1;
            }
            index.push(at as u32);
        }
        Self {
            owners: placed.iter().map(|&(_, _, m)| m).collect(),
            hashes,
            index,
            shift,
            members: members.len(),
        }
    }

    /// The member of the first point at or after `key_hash` (wrapping): the key's home. Panics on a
    /// ring of no members ([`Ring::is_empty`]).
    #[inline]
    pub fn home(&self, key_hash: u64) -> u32 {
        self.owners[self.entry_of(key_hash)]
    }

    /// Whether no member has a point.
    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// The members in the order a key tries them: its home, then the member of each following point
    /// (wrapping), each member once.
    pub fn walk(&self, key_hash: u64) -> impl Iterator<Item = u32> + '_ {
        let start = if self.is_empty() {
            0
        } else {
            self.entry_of(key_hash)
        };
        crate::member_walk::each_member_once(&self.owners, self.members, start)
    }

    /// The member of point `at` (any value: taken modulo the number of points).
    #[inline]
    pub(crate) fn entry(&self, at: usize) -> u32 {
        self.owners[at % self.owners.len()]
    }

    /// The point `key_hash` lands on: the first at or after it, wrapping past the last to the first.
    #[inline]
    pub(crate) fn entry_of(&self, key_hash: u64) -> usize {
        let bucket = bucket_of(key_hash, self.shift) as usize;
        let mut at = self.index.get(bucket).map_or(0, |&at| at as usize);
        while at < self.hashes.len() && self.hashes[at] < key_hash {
            at += 1;
        }
        if at == self.hashes.len() {
            0
        } else {
            at
        }
    }

    /// How many points the ring has (0 without members).
    pub fn len(&self) -> usize {
        self.hashes.len()
    }
}

/// The index bucket of `position`: its top bits (none when the index has one bucket).
#[inline]
fn bucket_of(position: u64, shift: u32) -> u64 {
    position.checked_shr(shift).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stable_hash::stable_hash;

    fn members(n: u32) -> Vec<(u64, u32)> {
        (0..n).map(|i| (stable_hash(&i), 1)).collect()
    }

    /// The member of `key_hash` by a plain search of the points, for the index to agree with.
    fn searched(ring: &Ring, key_hash: u64) -> u32 {
        let at = ring.hashes.partition_point(|&h| h < key_hash);
        ring.owners[if at == ring.len() { 0 } else { at }]
    }

    #[test]
    fn the_index_finds_what_a_search_finds() {
        for n in [1, 3, 10, 100] {
            let ring = Ring::new(&members(n), 400);
            for key in 0..20_000u64 {
                let hash = stable_hash(&key);
                assert_eq!(ring.home(hash), searched(&ring, hash), "n {n}, key {key}");
            }
            for edge in [0, u64::MAX, ring.hashes[0], ring.hashes[ring.len() - 1]] {
                assert_eq!(ring.home(edge), searched(&ring, edge));
            }
        }
    }

    #[test]
    fn points_follow_weight_and_ignore_the_order_members_are_given_in() {
        let weighted = [
            (stable_hash("a"), 3),
            (stable_hash("b"), 1),
            (stable_hash("c"), 0),
        ];
        let ring = Ring::new(&weighted, 3000);
        let count = |m| ring.owners.iter().filter(|&&o| o == m).count();
        assert_eq!((count(0), count(1), count(2)), (3000, 1000, 0));
        let mut given = members(7);
        let forward = Ring::new(&given, 100);
        given.reverse();
        let backward = Ring::new(&given, 100);
        for key in 0..5000u64 {
            let hash = stable_hash(&key);
            assert_eq!(forward.home(hash), 6 - backward.home(hash));
        }
    }

    #[test]
    fn a_member_leaving_moves_only_its_own_keys() {
        let all = members(10);
        let before = Ring::new(&all, 1000);
        let after = Ring::new(&all[1..], 1000);
        for key in 0..50_000u64 {
            let hash = stable_hash(&key);
            let home = before.home(hash);
            if home != 0 {
                assert_eq!(after.home(hash) + 1, home, "key {key}");
            }
        }
    }

    #[test]
    fn a_walk_names_every_member_once_home_first() {
        let ring = Ring::new(&members(5), 100);
        let walk: Vec<u32> = ring.walk(99).collect();
        let mut sorted = walk.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [0, 1, 2, 3, 4]);
        assert_eq!(walk[0], ring.home(99));
        assert!(Ring::new(&[], 7).is_empty());
        assert_eq!(Ring::new(&[], 7).walk(1).count(), 0);
    }
}
