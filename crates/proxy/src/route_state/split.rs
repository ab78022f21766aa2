//! A route's weighted split: which of its clusters takes the next request.
//!
//! Smooth weighted round robin (nginx's, as duet's backend weights): each pick adds every cluster's
//! weight to its running score, takes the highest, and takes the total off the winner. Over any run of
//! `total` picks each cluster gets exactly its weight, spread out rather than in bursts (95/5 sends the
//! 5 one by one, not five in a row). The scores are this worker's own: each worker keeps the shares
//! exactly, with no lock and nothing shared; a reload starts them over.

use duet_config::WeightedCluster;
use std::cell::Cell;

/// One route's split in one worker.
#[derive(Debug)]
pub(crate) struct Splitter {
    /// Each cluster's position in the split and its weight; clusters of weight 0 are left out.
    weights: Vec<(usize, i64)>,
    /// Their running scores, in the same order.
    scores: Vec<Cell<i64>>,
    total: i64,
}

impl Splitter {
    pub(crate) fn new(split: &[WeightedCluster]) -> Self {
        let weights: Vec<(usize, i64)> = split
            .iter()
            .enumerate()
            .filter(|(_, w)| w.weight > 0)
            .map(|(position, w)| (position, i64::from(w.weight)))
            .collect();
        let total = weights.iter().map(|&(_, w)| w).sum();
        Self {
            scores: weights.iter().map(|_| Cell::new(0)).collect(),
            weights,
            total,
        }
    }

    /// The position in the split of the cluster that takes this request.
    pub(crate) fn pick(&self) -> usize {
        let mut best: Option<(usize, i64)> = None;
        for (at, (&(_, weight), score)) in self.weights.iter().zip(&self.scores).enumerate() {
            let raised = score.get() + weight;
            score.set(raised);
            if best.is_none_or(|(_, top)| raised > top) {
                best = Some((at, raised));
            }
        }
        let Some((at, top)) = best else { return 0 };
        self.scores[at].set(top - self.total);
        self.weights[at].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(weights: &[u32]) -> Splitter {
        let split: Vec<WeightedCluster> = weights
            .iter()
            .enumerate()
            .map(|(cluster, &weight)| WeightedCluster { cluster, weight })
            .collect();
        Splitter::new(&split)
    }

    #[test]
    fn every_run_of_total_picks_gives_each_cluster_exactly_its_weight() {
        let splitter = split(&[95, 0, 5]);
        for _ in 0..3 {
            let mut counts = [0; 3];
            for _ in 0..100 {
                counts[splitter.pick()] += 1;
            }
            assert_eq!(counts, [95, 0, 5]);
        }
    }

    #[test]
    fn picks_are_spread_not_bunched() {
        let splitter = split(&[2, 1]);
        let picks: Vec<usize> = (0..6).map(|_| splitter.pick()).collect();
        assert_eq!(picks, [0, 1, 0, 0, 1, 0]);
        let splitter = split(&[95, 5]);
        let positions: Vec<usize> = (0..100).filter(|_| splitter.pick() == 1).collect();
        assert_eq!(positions.len(), 5);
        assert!(
            positions.windows(2).all(|w| w[1] - w[0] >= 19),
            "{positions:?}"
        );
    }
}
