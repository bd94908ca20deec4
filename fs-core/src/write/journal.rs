//! The upload journal: a durable record of every acknowledged file until it is in the bucket.
//!
//! Each staged file has one record, written before `close()` or `fsync()` returns and updated as
//! its upload moves on (staged, uploading with the resumable session or the parts already
//! uploaded, done, conflict). A record is made durable the classic way: write a temporary file,
//! fsync it, rename it over the old record, fsync the directory. A crash at any moment leaves
//! either the old record or the new one, never a torn one.
//!
//! On start-up the mount replays every record, so a file acknowledged before a crash or a
//! SIGKILL is uploaded on the next mount. A record that cannot be parsed is set aside as
//! `*.corrupt` and reported, never deleted.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One uploaded part of a parallel composite upload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartRecord {
    pub index: u32,
    /// Temporary object holding the part.
    pub key: String,
    pub generation: i64,
    pub crc32c: u32,
}

/// Where a staged file's upload stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum UploadState {
    /// Durable locally, not yet uploaded.
    Staged,
    /// An upload has started; what it has done so far can be reused.
    Uploading {
        #[serde(default)]
        session_url: Option<String>,
        #[serde(default)]
        parts: Vec<PartRecord>,
    },
    /// In the bucket as this generation; the record is about to be removed.
    Done { generation: i64 },
    /// The bucket's object changed since it was opened: the local version was saved beside it.
    Conflict { saved_as: String },
}

/// The journal record of one staged file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub id: u64,
    /// Object key the file is to be uploaded to.
    pub key: String,
    /// Generation the file was opened from; `None` for a new file (uploaded with
    /// `ifGenerationMatch=0`).
    pub base_generation: Option<i64>,
    pub size: u64,
    pub crc32c: u32,
    /// Modification time, seconds since the epoch, stored as `goog-reserved-file-mtime`.
    pub mtime: i64,
    #[serde(flatten)]
    pub state: UploadState,
}

/// The journal directory.
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
}

impl Journal {
    pub fn open(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Journal {
            dir: dir.to_path_buf(),
        })
    }

    fn path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id:016x}.json"))
    }

    /// Writes `rec` durably, replacing any earlier version.
    pub fn put(&self, rec: &Record) -> io::Result<()> {
        let tmp = self.dir.join(format!("{:016x}.json.tmp", rec.id));
        let json = serde_json::to_vec_pretty(rec).map_err(io::Error::other)?;
        {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&json)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, self.path(rec.id))?;
        File::open(&self.dir)?.sync_all()
    }

    /// Forgets a record once its file is safely in the bucket.
    pub fn remove(&self, id: u64) -> io::Result<()> {
        match std::fs::remove_file(self.path(id)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        File::open(&self.dir)?.sync_all()
    }

    /// Every record, in id order. Unreadable records are renamed `*.corrupt` and reported in the
    /// second list; leftover temporary files from a crash mid-write are removed (the record they
    /// were replacing is still in place).
    pub fn load_all(&self) -> io::Result<(Vec<Record>, Vec<PathBuf>)> {
        let mut records = Vec::new();
        let mut corrupt = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string();
            if name.ends_with(".json.tmp") {
                std::fs::remove_file(&path)?;
                continue;
            }
            if !name.ends_with(".json") {
                continue;
            }
            match std::fs::read(&path).map(|b| serde_json::from_slice::<Record>(&b)) {
                Ok(Ok(rec)) => records.push(rec),
                _ => {
                    let aside = path.with_extension("json.corrupt");
                    std::fs::rename(&path, &aside)?;
                    tracing::error!(record = %aside.display(), "unreadable journal record set aside; its staged data is kept");
                    corrupt.push(aside);
                }
            }
        }
        records.sort_by_key(|r| r.id);
        Ok((records, corrupt))
    }

    /// The next free record id: one past the highest in use.
    pub fn next_id(&self) -> io::Result<u64> {
        let (records, _) = self.load_all()?;
        Ok(records.last().map_or(1, |r| r.id + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: u64, state: UploadState) -> Record {
        Record {
            id,
            key: format!("dir/file{id}"),
            base_generation: Some(7),
            size: 10,
            crc32c: 99,
            mtime: 1_700_000_000,
            state,
        }
    }

    #[test]
    fn records_survive_reopen_and_updates_replace() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path()).unwrap();
        j.put(&rec(2, UploadState::Staged)).unwrap();
        j.put(&rec(1, UploadState::Staged)).unwrap();
        let parts = vec![PartRecord {
            index: 0,
            key: "tmp/0".into(),
            generation: 5,
            crc32c: 1,
        }];
        j.put(&rec(
            2,
            UploadState::Uploading {
                session_url: None,
                parts: parts.clone(),
            },
        ))
        .unwrap();
        drop(j);
        let j = Journal::open(dir.path()).unwrap();
        let (all, corrupt) = j.load_all().unwrap();
        assert!(corrupt.is_empty());
        assert_eq!(all.len(), 2);
        assert_eq!(all[0], rec(1, UploadState::Staged));
        assert_eq!(
            all[1].state,
            UploadState::Uploading {
                session_url: None,
                parts
            }
        );
        assert_eq!(j.next_id().unwrap(), 3);
        j.remove(1).unwrap();
        j.remove(1).unwrap();
        assert_eq!(j.load_all().unwrap().0.len(), 1);
    }

    #[test]
    fn torn_and_corrupt_records_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path()).unwrap();
        j.put(&rec(1, UploadState::Staged)).unwrap();
        // A crash while replacing record 1 leaves a temporary file: the old record still counts.
        std::fs::write(
            dir.path().join(format!("{:016x}.json.tmp", 1)),
            b"{\"id\": 1, \"ke",
        )
        .unwrap();
        std::fs::write(dir.path().join(format!("{:016x}.json", 9)), b"not json").unwrap();
        let (all, corrupt) = j.load_all().unwrap();
        assert_eq!(all, vec![rec(1, UploadState::Staged)]);
        assert_eq!(corrupt.len(), 1);
        assert!(
            corrupt[0].exists(),
            "a corrupt record is set aside, not deleted"
        );
    }
}
