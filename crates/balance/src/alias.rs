//! Walker's alias method: O(1) draws in proportion to weight.

/// A table that turns one uniform 64-bit draw into an index chosen with probability `w[i] / Σw`.
///
/// Built in O(n) (Vose's construction) when membership or weights change, off the request path.
///
/// ```
/// use duet_balance::{algo::AliasTable, Draws};
///
/// let table = AliasTable::new(&[3, 1, 0]);
/// let mut draws = Draws::with_seed(1);
/// let mut counts = [0; 3];
/// for _ in 0..40_000 {
///     counts[table.sample(draws.next_draw())] += 1;
/// }
/// assert_eq!(counts[2], 0, "weight 0 is never drawn");
/// assert!((29_000..31_000).contains(&counts[0]), "3 / 4 of the draws: {counts:?}");
/// ```
#[derive(Debug, Clone, Default)]
pub struct AliasTable {
    /// Threshold out of 2^32 below which a column keeps its own index.
    keep: Vec<u64>,
    alias: Vec<u32>,
}

const SCALE: f64 = 4_294_967_296.0; // 2^32

impl AliasTable {
    /// Builds the table. Zero weights are never drawn; an all-zero (or empty) input gives an empty table.
    pub fn new(weights: &[u32]) -> Self {
        let n = weights.len();
        let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
        if n == 0 || total == 0.0 {
            return Self::default();
        }
        let mut scaled: Vec<f64> = weights
            .iter()
            .map(|&w| f64::from(w) * n as f64 / total)
            .collect();
        let mut alias: Vec<u32> = (0..n as u32).collect();
        let mut keep = vec![1.0_f64; n];
        let (mut small, mut large): (Vec<usize>, Vec<usize>) =
            (0..n).partition(|&i| scaled[i] < 1.0);
        while let (Some(s), Some(&l)) = (small.pop(), large.last()) {
            keep[s] = scaled[s];
            alias[s] = l as u32;
            scaled[l] -= 1.0 - scaled[s];
            if scaled[l] < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        // Whatever remains is 1 up to rounding error.
        let keep = keep
            .into_iter()
            .map(|p| (p.clamp(0.0, 1.0) * SCALE).round() as u64)
            .collect();
        Self { keep, alias }
    }

    /// Number of columns (the length of the weight list it was built from).
    pub fn len(&self) -> usize {
        self.keep.len()
    }

    /// Whether the table can draw nothing.
    pub fn is_empty(&self) -> bool {
        self.keep.is_empty()
    }

    /// Maps one uniform draw to an index. The high 32 bits choose the column, the low 32 bits the coin.
    #[inline]
    pub fn sample(&self, draw: u64) -> usize {
        let n = self.keep.len() as u64;
        let column = (((draw >> 32) * n) >> 32) as usize;
        let coin = draw & 0xFFFF_FFFF;
        if coin < self.keep[column] {
            column
        } else {
            self.alias[column] as usize
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::SmallRng, Rng, SeedableRng};

    #[test]
    fn draws_in_proportion_to_weight() {
        let weights = [10, 1, 1, 0, 4];
        let table = AliasTable::new(&weights);
        let mut rng = SmallRng::seed_from_u64(3);
        let mut counts = [0u32; 5];
        let draws = 320_000;
        for _ in 0..draws {
            counts[table.sample(rng.next_u64())] += 1;
        }
        assert_eq!(counts[3], 0, "a zero weight is never drawn");
        for (i, &w) in weights.iter().enumerate() {
            let expected = f64::from(w) / 16.0;
            let got = f64::from(counts[i]) / f64::from(draws);
            assert!(
                (got - expected).abs() < 0.005,
                "index {i}: {got} vs {expected}"
            );
        }
    }

    #[test]
    fn empty_and_all_zero_tables_are_empty() {
        assert!(AliasTable::new(&[]).is_empty());
        assert!(AliasTable::new(&[0, 0]).is_empty());
    }
}
