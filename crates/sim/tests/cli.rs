//! The `duet-sim` command line as a shell pipeline uses it.

use std::process::{Command, Stdio};

#[test]
fn a_reader_that_goes_away_ends_the_run_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_duet-sim"))
        .args(["herd", "--arrivals", "20000", "--staleness", "0,1,2,4"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("duet-sim runs");
    // What `| head -0` does: the pipe's only reader closes before the first line is written.
    drop(child.stdout.take());
    let output = child.wait_with_output().expect("duet-sim ends");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{:?}: {stderr}", output.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}
