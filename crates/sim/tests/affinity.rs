//! Consistent hashing with bounded loads (issue #48's acceptance figures), through duet-balance's keyed
//! picks, on a Maglev table and on a hash ring. `cargo test -p duet-sim --release --test affinity --
//! --nocapture` prints the tables.

use duet_balance::{Affinity, Walk};
use duet_sim::affinity::{moved, zipf};

#[test]
fn a_backend_leaving_or_joining_moves_few_more_keys_than_its_share() {
    println!("| n | table | moved when one leaves | 1/n | moved when one joins | 1/(n+1) |");
    // Larger Maglev tables come closer to 1/n, at a cost per rebuild (100 backends, 655,373 entries:
    // 0.0111 leaving, 0.0109 joining; 6,553,577: 0.0107 and 0.0100) too slow for a test.
    for n in [10u32, 100] {
        for (table, affinity) in [
            ("maglev 65,537", Affinity::maglev()),
            ("ring 1,024 each", Affinity::ring()),
        ] {
            let m = moved(n, 100_000, affinity);
            let (leave, join) = (1.0 / f64::from(n), 1.0 / f64::from(n + 1));
            println!(
                "| {n} | {table} | {:.4} | {leave:.4} | {:.4} | {join:.4} |",
                m.leave, m.join
            );
            // Maglev's own disruption: keys of others move too when the table is rebuilt, more as
            // the table holds fewer entries per backend (655 here for 100 backends). A ring moves only
            // the keys of the backend that left or joined: its share, within a few percent.
            let slack = match (affinity.algorithm(), n) {
                ("maglev", 100) => 1.7,
                _ => 1.1,
            };
            assert!(m.leave <= slack * leave, "{table}: {m:?}");
            assert!(m.join <= slack * join, "{table}: {m:?}");
            assert!(m.leave >= 0.9 * leave, "{table}: {m:?}");
        }
    }
}

#[test]
fn zipf_keys_stay_under_the_bound_and_p2c_walks_no_more_than_next() {
    // 10 backends, 40 requests in flight each on average, so that ⌈1.25 · mean⌉ is 1.25 · mean.
    let run = |affinity| zipf(10, 10_000, 1.1, 400, 100_000, affinity, 7);
    println!("| table | walk | max in flight / mean (worst) | (average) | away from home |");
    for table in [Affinity::maglev(), Affinity::ring()] {
        let unbounded = run(table.unbounded());
        let next = run(table.with_bound(1.25).with_walk(Walk::Next));
        let p2c = run(table.with_bound(1.25).with_walk(Walk::P2c));
        for r in [unbounded, next, p2c] {
            println!(
                "| {} | {} | {:.3} | {:.3} | {:.3} |",
                r.table, r.walk, r.max_over_mean, r.mean_max_over_mean, r.away_from_home
            );
        }
        assert!(unbounded.max_over_mean > 2.0, "{unbounded:?}");
        assert_eq!(unbounded.away_from_home, 0.0);
        for r in [next, p2c] {
            assert!(r.max_over_mean <= 1.25 + 1e-9, "{r:?}");
            assert!(r.away_from_home < 0.5, "{r:?}");
        }
    }
}
