//! The manual (README.md and the mdBook under docs/) against the code: every YAML block loads, every
//! configuration key, metric family and access-log field has its entry, and every relative link and
//! anchor resolves. A reference that a test keeps complete cannot go stale quietly.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const CONFIGURATION: &str = "docs/src/reference/configuration.md";
const METRICS: &str = "docs/src/reference/metrics.md";
const ACCESS_LOG: &str = "docs/src/reference/access-log.md";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(root().join(relative))
        .unwrap_or_else(|error| panic!("{relative}: {error}"))
}

/// The files under `dir` (relative to the root) whose names end in `.ext`, relative to the root,
/// sorted.
fn files_under(dir: &str, ext: &str) -> Vec<String> {
    fn walk(dir: &Path, ext: &str, found: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, ext, found);
            } else if path.extension().is_some_and(|e| e == ext) {
                found.push(path);
            }
        }
    }
    let mut paths = Vec::new();
    walk(&root().join(dir), ext, &mut paths);
    let mut relative: Vec<String> = (paths.iter())
        .map(|path| {
            let relative = path.strip_prefix(root()).expect("under the root");
            relative.to_string_lossy().into_owned()
        })
        .collect();
    relative.sort();
    relative
}

fn rust_files(dir: &str) -> Vec<String> {
    files_under(dir, "rs")
}

/// README.md and every Markdown page under docs/src, as (path relative to the root, text).
fn pages() -> Vec<(String, String)> {
    let paths = std::iter::once("README.md".to_owned()).chain(files_under("docs/src", "md"));
    paths
        .map(|relative| {
            let text = read(&relative);
            (relative, text)
        })
        .collect()
}

/// The fenced blocks of `text` whose info string is `lang`, each with its first line's number.
fn blocks(text: &str, lang: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    // The open block: its first line's number, whether it is `lang`, and its text.
    let mut block: Option<(usize, bool, String)> = None;
    for (number, line) in text.lines().enumerate() {
        let fence = line.trim_end();
        match block.take() {
            None if fence.starts_with("```") => {
                let wanted = fence.trim_start_matches('`').trim() == lang;
                block = Some((number + 2, wanted, String::new()));
            }
            None => {}
            Some((first, true, body)) if fence == "```" => found.push((first, body)),
            Some((_, false, _)) if fence == "```" => {}
            Some((first, wanted, mut body)) => {
                body.push_str(line);
                body.push('\n');
                block = Some((first, wanted, body));
            }
        }
    }
    found
}

/// A snippet made a whole config: the listener, clusters (those the examples name) and route it lacks.
fn completed(yaml: &str) -> String {
    let has = |key: &str| yaml.lines().any(|line| line.starts_with(key));
    let mut config = String::new();
    if !has("listeners:") {
        config.push_str("listeners: [ { address: 127.0.0.1:0, name: internal } ]\n");
    }
    if !has("clusters:") {
        config.push_str("clusters:\n");
        for name in ["api", "api-v1", "api-v2", "shadow", "web", "admin"] {
            config.push_str(&format!(
                "  - {{ name: {name}, backends: [ {{ address: 127.0.0.1:9 }} ] }}\n"
            ));
        }
    }
    if !has("routes:") {
        // A snippet of clusters alone: a catch-all route to its first cluster makes it a whole config.
        let cluster = yaml
            .split("clusters:")
            .nth(1)
            .and_then(|rest| rest.split("name:").nth(1))
            .and_then(|rest| rest.split([',', '}', '\n']).next())
            .map_or("web", str::trim);
        config.push_str(&format!(
            "routes: [ {{ match: {{ path_prefix: / }}, cluster: {cluster} }} ]\n"
        ));
    }
    config + yaml
}

#[test]
fn every_yaml_block_of_the_readme_and_the_book_loads() {
    let mut loaded = 0;
    let mut routing = 0;
    for (path, text) in pages() {
        for (line, yaml) in blocks(&text, "yaml") {
            let config = completed(&yaml);
            if let Err(errors) = duet_config::parse(&config, &path) {
                panic!("{path}:{line}: a YAML block does not load:\n{config}\n{errors}");
            }
            loaded += 1;
            routing += usize::from(path == "docs/src/routing.md");
        }
    }
    // The routing page had eight examples when they lived in the README: none may go missing.
    assert!(
        routing >= 8,
        "docs/src/routing.md has {routing} YAML blocks"
    );
    assert!(loaded >= 19, "only {loaded} YAML blocks loaded");
}

/// The entries of a reference page: every `` `name` `` in the first column of a table row.
fn table_entries(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once('`'))
        .map(|(name, _)| name.to_owned())
        .collect()
}

#[test]
fn the_configuration_reference_has_every_key_of_the_schema() {
    let entries = table_entries(&read(CONFIGURATION));
    let keys = duet_config::schema_keys();
    let missing: Vec<_> = keys.iter().filter(|key| !entries.contains(*key)).collect();
    assert!(
        missing.is_empty(),
        "{CONFIGURATION} has no entry (a table row opening with `key`) for: {missing:#?}"
    );
    let unknown: Vec<_> = entries.iter().filter(|e| !keys.contains(e)).collect();
    assert!(
        unknown.is_empty(),
        "{CONFIGURATION} documents keys the schema does not have: {unknown:#?}"
    );
}

#[test]
fn the_metrics_reference_has_every_family() {
    let source = read("crates/proxy/src/telemetry/metrics_families.rs");
    let mut families: BTreeSet<String> = source
        .split("Family::new(\"")
        .skip(1)
        .filter_map(|rest| rest.split_once('"'))
        .map(|(name, _)| name.to_owned())
        .filter(|name| !name.is_empty())
        .collect();
    // The filters' counter families are declared in their modules: `CounterFamily { name: "…"`.
    for file in rust_files("crates/proxy/src/filter") {
        let source = read(&file);
        let declared = (source.split("= CounterFamily {").skip(1))
            .filter_map(|rest| rest.split_once("name: \"")?.1.split_once('"'))
            .map(|(name, _)| name.to_owned());
        families.extend(declared);
    }
    assert!(families.len() > 30, "{families:?}");
    let entries = table_entries(&read(METRICS));
    let missing: Vec<_> = families.difference(&entries).collect();
    let unknown: Vec<_> = entries.difference(&families).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "{METRICS}: families without an entry {missing:?}, entries without a family {unknown:?}"
    );
}

#[test]
fn the_access_log_reference_has_every_field() {
    let source = read("crates/proxy/src/telemetry/access_log.rs");
    // The fields the line formatter writes; its tests, after `#[cfg(test)]`, write made-up ones.
    let code = source.split("#[cfg(test)]").next().unwrap_or_default();
    let fields: BTreeSet<String> = code
        .split("name!(\"")
        .skip(1)
        .filter_map(|rest| rest.split_once('"'))
        .map(|(name, _)| name.to_owned())
        .chain(["timestamp".to_owned()])
        .collect();
    assert!(fields.len() > 15, "{fields:?}");
    let entries = table_entries(&read(ACCESS_LOG));
    let missing: Vec<_> = fields.difference(&entries).collect();
    assert!(
        missing.is_empty(),
        "{ACCESS_LOG} has no entry for {missing:?}"
    );
}

/// GitHub's and mdBook's anchor of a heading: lowercase, spaces to `-`, other punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut in_code = false;
    let mut found = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            found.insert(anchor(line.trim_start_matches('#')));
        }
    }
    found
}

/// Every `](target)` of `text` outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut found = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        for piece in line.split("](").skip(1) {
            if let Some((target, _)) = piece.split_once(')') {
                found.push(target.to_owned());
            }
        }
    }
    found
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for (path, text) in pages() {
        let dir = Path::new(&path).parent().unwrap_or(Path::new(""));
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let resolved = if file.is_empty() {
                PathBuf::from(&path)
            } else {
                dir.join(file)
            };
            let Ok(linked) = std::fs::read(root().join(&resolved)) else {
                broken.push(format!("{path}: {target} (no file {})", resolved.display()));
                continue;
            };
            if !fragment.is_empty() {
                let linked = String::from_utf8_lossy(&linked);
                if !anchors(&linked).contains(fragment) {
                    broken.push(format!("{path}: {target} (no heading #{fragment})"));
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} links checked");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_page_of_the_book_is_in_its_summary() {
    let summary = read("docs/src/SUMMARY.md");
    let listed: BTreeSet<String> = links(&summary).into_iter().collect();
    for (path, _) in pages() {
        let Some(page) = path.strip_prefix("docs/src/") else {
            continue;
        };
        if page != "SUMMARY.md" {
            assert!(
                listed.contains(page),
                "docs/src/SUMMARY.md does not list {page}"
            );
        }
    }
}
