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
    // A front page: the manual is docs/ (its YAML blocks, and the README's, load in tests/docs.rs).
    assert!(
        README.lines().count() <= 200,
        "README.md is {} lines: move prose to docs/",
        README.lines().count()
    );
}
