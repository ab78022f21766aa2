//! The crate's public names, listed in `public-api.txt`: a change to what the crate exports fails here
//! until the list is updated with it, so it is always deliberate (and visible in review).

use std::collections::BTreeSet;

/// Every name `lib.rs` exports, as `path::Name` (`algo::P2c` for the algorithm module's).
fn exported() -> BTreeSet<String> {
    let lib = include_str!("../src/lib.rs");
    let mut names = BTreeSet::new();
    let mut module = String::new();
    let mut statement = String::new();
    for line in lib.lines().map(str::trim) {
        if line.starts_with("//") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("pub mod ") {
            if let Some(name) = rest.strip_suffix(" {") {
                module = format!("{name}::");
            } else {
                names.insert(format!("mod {}", rest.trim_end_matches(';')));
            }
            continue;
        }
        if line == "}" {
            module.clear();
            continue;
        }
        if line.starts_with("pub use ") || !statement.is_empty() {
            statement.push_str(line);
            statement.push(' ');
            if !line.ends_with(';') {
                continue;
            }
            let path = statement
                .trim()
                .trim_start_matches("pub use ")
                .trim_end_matches(';');
            let listed = match path.split_once('{') {
                Some((_, list)) => list
                    .trim_end_matches('}')
                    .split(',')
                    .map(str::trim)
                    .collect(),
                None => vec![path.rsplit("::").next().unwrap_or(path)],
            };
            for name in listed.into_iter().filter(|n| !n.is_empty()) {
                names.insert(format!("{module}{name}"));
            }
            statement.clear();
        }
    }
    names
}

#[test]
fn the_exported_names_are_the_listed_ones() {
    let listed: BTreeSet<String> = include_str!("../public-api.txt")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    let exported = exported();
    let added: Vec<_> = exported.difference(&listed).collect();
    let removed: Vec<_> = listed.difference(&exported).collect();
    assert!(
        added.is_empty() && removed.is_empty(),
        "the public API changed: exported but not in public-api.txt: {added:?}; \
         in public-api.txt but no longer exported: {removed:?}. If deliberate, update \
         crates/balance/public-api.txt"
    );
}
