//! `load` reads only a regular file, and at most 16 MiB of it: a FIFO would block it and a device
//! such as /dev/zero would fill memory.

use std::{path::PathBuf, sync::mpsc, time::Duration};

/// `load(path)` on a thread, so that a load that blocks or never ends fails the test instead of
/// hanging it.
fn load_within_seconds(path: PathBuf) -> String {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = send.send(duet_config::load(&path).map(|_| ()));
    });
    match receive.recv_timeout(Duration::from_secs(10)) {
        Ok(Ok(())) => panic!("loaded"),
        Ok(Err(errors)) => errors.to_string(),
        Err(_) => panic!("load did not return within 10 s"),
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("duet-config-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[test]
fn a_fifo_is_refused_without_waiting_for_a_writer() {
    let dir = temp_dir("fifo");
    let fifo = dir.join("duet.yaml");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    let text = load_within_seconds(fifo.clone());
    assert!(
        text.starts_with(&format!(
            "error: {}: cannot read the configuration file: \
             it is a FIFO (named pipe), not a regular file",
            fifo.display()
        )),
        "{text}"
    );
    assert!(
        text.contains("hint: pass the YAML file itself with --config FILE"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_device_is_refused_before_reading_it() {
    let text = load_within_seconds(PathBuf::from("/dev/zero"));
    assert!(
        text.starts_with(
            "error: /dev/zero: cannot read the configuration file: \
             it is a character device, not a regular file"
        ),
        "{text}"
    );
}

#[test]
fn a_directory_is_refused() {
    let dir = temp_dir("dir");
    let text = load_within_seconds(dir.clone());
    assert!(
        text.contains("cannot read the configuration file: it is a directory, not a regular file"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_file_over_16_mib_is_refused_unread() {
    let dir = temp_dir("large");
    let path = dir.join("duet.yaml");
    // Sparse: 17 MiB long, nothing written.
    let file = std::fs::File::create(&path).expect("create");
    file.set_len(17 << 20).expect("set_len");
    let text = load_within_seconds(path.clone());
    assert!(
        text.starts_with(&format!(
            "error: {}: cannot read the configuration file: \
             it is larger than 16 MiB, the most duet reads",
            path.display()
        )),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_file_of_exactly_16_mib_is_read() {
    let dir = temp_dir("limit");
    let path = dir.join("duet.yaml");
    // A valid config padded with a comment to the byte limit: read whole, and parsed.
    let config = "listeners: [ { address: 127.0.0.1:0 } ]\nroutes: [ { cluster: web } ]\n\
                  clusters: [ { name: web, backends: [ { address: 127.0.0.1:9 } ] } ]\n#";
    let padding = "x".repeat((16 << 20) - config.len());
    std::fs::write(&path, format!("{config}{padding}")).expect("write");
    let config = duet_config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.clusters[0].name, "web");
    let _ = std::fs::remove_dir_all(&dir);
}
