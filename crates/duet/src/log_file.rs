//! The access log written to a file (`duet run --access-log FILE`), reopened on SIGUSR1 so logrotate
//! can move it away (nginx's `kill -USR1` convention).

use std::{
    fs::{File, OpenOptions},
    io::{self, Write},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

/// The open access-log file, shared by the log-writer thread (which writes) and the signal loop
/// (which reopens it).
#[derive(Clone, Debug)]
pub(crate) struct LogFile {
    path: PathBuf,
    file: Arc<Mutex<File>>,
}

impl LogFile {
    /// Opens `path` for appending, creating it if needed.
    pub(crate) fn open(path: &Path) -> io::Result<Self> {
        Ok(Self {
            path: path.to_path_buf(),
            file: Arc::new(Mutex::new(append(path)?)),
        })
    }

    /// Opens the path again: after logrotate renamed the file, new lines go to a new file at the
    /// configured path. On failure the old file stays in use.
    pub(crate) fn reopen(&self) -> io::Result<()> {
        let file = append(&self.path)?;
        let mut current = self
            .file
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let _ = current.flush();
        *current = file;
        Ok(())
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

fn append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

impl Write for LogFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .flush()
    }
}
