//! The README's first lines are what a newcomer runs: they must stay there and stay true.

const README: &str = include_str!("../README.md");
const CI: &str = include_str!("../.ci/run");

fn opening() -> String {
    README.lines().take(15).collect::<Vec<_>>().join("\n")
}

/// The commands of the code blocks in the README's opening, in order.
fn opening_commands() -> Vec<String> {
    let mut commands = Vec::new();
    let mut in_block = false;
    for line in README.lines().take(15) {
        match (in_block, line.trim()) {
            (false, "```sh") => in_block = true,
            (true, "```") => in_block = false,
            (true, command) => commands.push(command.to_owned()),
            _ => {}
        }
    }
    commands
}

#[test]
fn the_readme_opens_with_the_run_and_test_commands() {
    assert!(
        README.starts_with("# duet\n"),
        "README.md must open with its title"
    );
    assert_eq!(
        opening_commands(),
        ["cargo run --release -- demo", "cargo test --workspace"],
        "README.md's first lines must show the demo and the test command:\n{}",
        opening()
    );
}

#[test]
fn ci_runs_the_readme_test_command() {
    let commands = opening_commands();
    let test_command = commands.get(1).expect("the README shows a test command");
    assert!(
        CI.lines()
            .any(|line| line.trim_start().starts_with(test_command.as_str())),
        ".ci/run must run the README's test command `{test_command}`"
    );
}

#[test]
fn no_readme_line_is_repeated_by_a_broken_edit() {
    // A scripted edit once wrote the same block between every character of the file (135k lines).
    let mut seen = std::collections::HashMap::new();
    for line in README.lines().filter(|line| line.trim().len() > 40) {
        *seen.entry(line).or_insert(0) += 1;
    }
    let worst = seen.into_iter().max_by_key(|(_, count)| *count);
    if let Some((line, count)) = worst {
        assert!(count <= 3, "README.md repeats {count} times: {line}");
    }
    assert!(
        README.lines().count() < 2_000,
        "README.md is {} lines",
        README.lines().count()
    );
}

/// The YAML blocks of the README's `## Routing` section, each with whether it is marked to be skipped
/// (a feature built on another branch: the marker goes when that branch is merged).
fn routing_examples() -> Vec<(bool, String)> {
    let section = README
        .split("\n## Routing\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("README.md has a ## Routing section");
    let mut examples = Vec::new();
    let (mut block, mut skip, mut marked) = (None::<String>, false, false);
    for line in section.lines() {
        match (&mut block, line.trim_end()) {
            (None, "```yaml") => {
                block = Some(String::new());
                skip = marked;
            }
            (None, text) if !text.is_empty() => marked = text.starts_with("<!-- readme-test: skip"),
            (Some(text), "```") => {
                examples.push((skip, std::mem::take(text)));
                block = None;
                marked = false;
            }
            (Some(text), line) => {
                text.push_str(line);
                text.push('\n');
            }
            _ => {}
        }
    }
    examples
}

#[test]
fn the_routing_examples_load() {
    let preamble = "listeners: [ { address: 127.0.0.1:0 } ]\nclusters:\n".to_owned()
        + &["api", "api-v1", "api-v2", "shadow", "web"]
            .map(|name| {
                format!("  - {{ name: {name}, backends: [ {{ address: 127.0.0.1:9 }} ] }}\n")
            })
            .concat();
    let examples = routing_examples();
    let skipped = examples.iter().filter(|(skip, _)| *skip).count();
    assert_eq!((examples.len(), skipped), (8, 0), "{examples:#?}");
    for (_, yaml) in examples.iter().filter(|(skip, _)| !skip) {
        let config = format!("{preamble}{yaml}");
        if let Err(errors) = duet_config::parse(&config, "README.md") {
            panic!("a README routing example does not load:\n{yaml}\n{errors}");
        }
    }
}
