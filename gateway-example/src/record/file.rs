//! [`RotatingFile`]: the record's file, rotated by size: `path` is written; once a line takes it
//! to `max_file_bytes`, it becomes `path.1`, `path.1` becomes `path.2`, … up to `path.{keep}`,
//! the oldest is deleted, and a new `path` is started.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// An append-only file of lines that rotates by size.
#[derive(Debug)]
pub struct RotatingFile {
    path: PathBuf,
    max_bytes: u64,
    keep: u32,
    out: BufWriter<File>,
    /// Bytes in the current file (what was there when opened, and every line since).
    written: u64,
}

impl RotatingFile {
    /// Opens `path` to append (creating it and its directory), rotating at `max_bytes`, keeping
    /// `keep` rotated files.
    pub fn open(path: &Path, max_bytes: u64, keep: u32) -> io::Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let written = file.metadata()?.len();
        Ok(Self {
            path: path.to_owned(),
            max_bytes,
            keep,
            out: BufWriter::with_capacity(64 * 1024, file),
            written,
        })
    }

    /// Appends `line` (which ends with its newline), rotating after it when the file is full.
    pub fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        self.out.write_all(line)?;
        self.written += line.len() as u64;
        if self.written >= self.max_bytes {
            self.rotate()?;
        }
        Ok(())
    }

    /// Writes what is buffered to the file.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// The rotated file `n` (1 is the newest).
    pub fn rotated(path: &Path, n: u32) -> PathBuf {
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".{n}"));
        PathBuf::from(name)
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.out.flush()?;
        if self.keep == 0 {
            std::fs::remove_file(&self.path)?;
        } else {
            // The oldest goes; each other moves one up; the full file becomes `.1`.
            match std::fs::remove_file(Self::rotated(&self.path, self.keep)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            for n in (1..self.keep).rev() {
                match std::fs::rename(
                    Self::rotated(&self.path, n),
                    Self::rotated(&self.path, n + 1),
                ) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
            }
            std::fs::rename(&self.path, Self::rotated(&self.path, 1))?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        self.out = BufWriter::with_capacity(64 * 1024, file);
        self.written = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("record-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn lines(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .map(|t| t.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    #[test]
    fn rotates_by_size_and_keeps_the_newest_files() {
        let dir = dir("rotate");
        let path = dir.join("sub/r.jsonl");
        // 10-byte lines, rotated at 25 bytes: three lines a file.
        let mut file = RotatingFile::open(&path, 25, 2).unwrap();
        for i in 0..10 {
            file.write_line(format!("line {i:03}\n").as_bytes())
                .unwrap();
        }
        file.flush().unwrap();
        assert_eq!(lines(&path), ["line 009"]);
        assert_eq!(
            lines(&RotatingFile::rotated(&path, 1)),
            ["line 006", "line 007", "line 008"]
        );
        assert_eq!(
            lines(&RotatingFile::rotated(&path, 2)),
            ["line 003", "line 004", "line 005"]
        );
        assert!(!RotatingFile::rotated(&path, 3).exists(), "only 2 kept");
        // Reopened, it appends and counts what is there.
        drop(file);
        let mut file = RotatingFile::open(&path, 25, 2).unwrap();
        file.write_line(b"line 010\n").unwrap();
        file.write_line(b"line 011\n").unwrap();
        file.flush().unwrap();
        assert_eq!(
            lines(&RotatingFile::rotated(&path, 1)),
            ["line 009", "line 010", "line 011"]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn keep_zero_deletes_a_full_file() {
        let dir = dir("keep0");
        let path = dir.join("r.jsonl");
        let mut file = RotatingFile::open(&path, 15, 0).unwrap();
        for i in 0..3 {
            file.write_line(format!("line {i:03}\n").as_bytes())
                .unwrap();
        }
        file.flush().unwrap();
        assert_eq!(lines(&path), ["line 002"]);
        assert!(!RotatingFile::rotated(&path, 1).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
