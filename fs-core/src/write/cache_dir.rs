//! The cache directory of one mount: where staged data and the journal live.
//!
//! Layout: `lock` (held with an exclusive file lock for the life of the mount, so two mounts can never share
//! one directory), `staging/<id>.data`, `journal/journal.log`, and `mount-id`, a random tag
//! made once per cache directory. Temporary part objects in the bucket are named under that
//! tag, so a mount can tell its own leftovers from another mount's in-flight work.
//! Directories are mode 0700 and files 0600: staged data is the user's data.

use crate::platform;
use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

/// An open, locked cache directory.
#[derive(Debug)]
pub struct CacheDir {
    root: PathBuf,
    tag: String,
    _lock: File,
}

impl CacheDir {
    /// Creates (if needed) and locks `root`. Fails with a clear message if another mount holds it.
    pub fn open(root: &Path) -> Result<Self, String> {
        let mk = |p: &Path| -> Result<(), String> {
            platform::create_private_dir(p)
                .map_err(|e| format!("cannot create cache directory {}: {e}", p.display()))
        };
        mk(root)?;
        mk(&root.join("staging"))?;
        mk(&root.join("journal"))?;
        let lock = platform::private_file(
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false),
        )
        .open(root.join("lock"))
        .map_err(|e| format!("cannot open {}: {e}", root.join("lock").display()))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(format!(
                "cache directory {} is in use by another mount; give each mount its own --cache-dir",
                root.display()
            )),
            Err(TryLockError::Error(e)) => {
                return Err(format!("cannot lock cache directory {}: {e}", root.display()))
            }
        }
        let tag = mount_tag(root)?;
        Ok(CacheDir {
            root: root.to_path_buf(),
            tag,
            _lock: lock,
        })
    }

    /// This cache directory's tag: names its temporary parts in the bucket.
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// Ids of every staging file present, and the paths of files that are not staging files
    /// of ours (left by a copy interrupted by a crash).
    pub fn staging_ids(&self) -> std::io::Result<(Vec<u64>, Vec<PathBuf>)> {
        let mut ids = Vec::new();
        let mut other = Vec::new();
        for entry in std::fs::read_dir(self.root.join("staging"))? {
            let path = entry?.path();
            let id = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".data"))
                .and_then(|n| u64::from_str_radix(n, 16).ok());
            match id {
                Some(id) => ids.push(id),
                None => other.push(path),
            }
        }
        ids.sort_unstable();
        Ok((ids, other))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn staging_path(&self, id: u64) -> PathBuf {
        self.root.join("staging").join(format!("{id:016x}.data"))
    }

    /// Makes the names of newly created staging files durable (a power loss must not leave a
    /// journal record whose staging file vanished with its directory entry).
    pub fn sync_staging_names(&self) -> std::io::Result<()> {
        platform::sync_dir(&self.root.join("staging"))
    }

    pub fn journal_dir(&self) -> PathBuf {
        self.root.join("journal")
    }
}

/// Reads the tag of the cache directory at `root`, making one the first time.
fn mount_tag(root: &Path) -> Result<String, String> {
    let path = root.join("mount-id");
    if let Ok(text) = std::fs::read_to_string(&path) {
        let tag = text.trim();
        if tag.len() == 16 && tag.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(tag.to_string());
        }
    }
    let tag = format!("{:016x}", rand::random::<u64>());
    let tmp = root.join("mount-id.tmp");
    std::fs::write(&tmp, &tag)
        .and_then(|_| std::fs::rename(&tmp, &path))
        .and_then(|_| platform::sync_dir(root))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(tag)
}

/// The default cache directory for a mount: under the user's cache directory, one
/// sub-directory per bucket, prefix and mountpoint.
pub fn default_cache_dir(bucket: &str, prefix: &str, mountpoint: &Path) -> PathBuf {
    let base = platform::user_cache_base();
    let tag = crc32c::crc32c(format!("{bucket}/{prefix}@{}", mountpoint.display()).as_bytes());
    base.join("bucketdrive").join(format!("{bucket}-{tag:08x}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn two_mounts_cannot_share_a_cache_dir() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("c");
        let first = CacheDir::open(&root).unwrap();
        let mode = std::fs::metadata(&root).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let err = CacheDir::open(&root).unwrap_err();
        assert!(err.contains("in use by another mount"), "{err}");
        let tag = first.tag().to_string();
        drop(first);
        let again = CacheDir::open(&root).unwrap();
        assert_eq!(again.tag(), tag, "the tag is kept across mounts");
        let other = CacheDir::open(&dir.path().join("d")).unwrap();
        assert_ne!(other.tag(), tag, "each cache directory has its own");
    }

    #[test]
    fn default_dirs_differ_per_mount() {
        let a = default_cache_dir("b", "", Path::new("/mnt/a"));
        let b = default_cache_dir("b", "", Path::new("/mnt/b"));
        assert_ne!(a, b);
        assert!(a.to_string_lossy().contains("bucketdrive"));
    }
}
