//! The walk Maglev and the ring share: a key's candidates in table order, each member once.

/// The members of a table's `entries` from `start` on (wrapping), each once: a key's walk over
/// Maglev's table or the ring's points, `members` of them in all.
pub(crate) fn each_member_once(
    entries: &[u32],
    members: usize,
    start: usize,
) -> impl Iterator<Item = u32> + '_ {
    let mut seen = vec![false; members];
    let len = entries.len();
    (0..len)
        .map(move |step| entries[(start + step) % len])
        .filter(move |&m| !std::mem::replace(&mut seen[m as usize], true))
}
