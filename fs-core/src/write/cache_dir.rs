//! The cache directory of one mount: where staged data and the journal live.
//!
//! Layout: `lock` (held with an exclusive file lock for the life of the mount, so two mounts can never share
//! one directory), `staging/<id>.data`, `journal/journal.log`, and `mount-id`, a random tag
//! made once per cache directory. Temporary part objects in the bucket are named under that
//! tag, so a mount can tell its own leftovers from another mount's in-flight work.
//! Directories are mode 0700 and files 0600: staged data is the user's data.
//!
//! Which directory is the root: by default one per bucket, prefix and mountpoint under the
//! user's cache directory ([`default_cache_dir`]). A directory the user names with
//! `--cache-dir` is not ours: it may be shared (`/tmp`), so its mode is never changed and the
//! root is our own sub-directory [`SUBDIR`] inside it ([`in_user_dir`]). Every directory we
//! own is checked when opened: a real directory (not a symbolic link), owned by the effective
//! user, narrowed to 0700 through a descriptor ([`platform::create_private_dir`]).
//!
//! Earlier versions used a named directory itself as the root. One that still holds that
//! layout (`mount-id`, `journal/` or `staging/` directly in it) keeps being used as it is, so
//! what it has staged is replayed, provided it is ours and writable by no one else; otherwise
//! it is left alone, with a warning, and the sub-directory is used.

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
    /// Creates (if needed) and locks `root`, a directory of ours. Fails with a clear message
    /// if another mount holds it, or if it is a symbolic link or someone else's.
    pub fn open(root: &Path) -> Result<Self, String> {
        Self::open_at(root, false)
    }

    /// Like [`Self::open`]; with `legacy`, `root` is a directory the user named that holds
    /// the earlier layout: used as it is, its own mode untouched.
    pub fn open_at(root: &Path, legacy: bool) -> Result<Self, String> {
        let mk = |p: &Path| -> Result<(), String> {
            platform::create_private_dir(p)
                .map_err(|e| format!("cannot use cache directory {}: {e}", p.display()))
        };
        if legacy {
            tracing::info!(
                cache_dir = %root.display(),
                "the cache directory holds the layout of an earlier version; using it as it is"
            );
        } else {
            mk(root)?;
        }
        mk(&root.join("staging"))?;
        mk(&root.join("journal"))?;
        let mut options = OpenOptions::new();
        options.read(true).write(true).create(true).truncate(false);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.custom_flags(libc::O_NOFOLLOW);
        }
        let lock = platform::private_file(&mut options)
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

/// Our sub-directory inside a `--cache-dir` the user names. Not `bucketdrive`: naming the
/// user's cache directory itself must not put a mount's files among the default per-mount
/// directories, which live in `<user cache>/bucketdrive/`.
pub const SUBDIR: &str = "bucketdrive-cache";

/// The root inside a directory the user named, and whether it is that directory itself,
/// holding an earlier version's layout (see the module documentation).
pub fn in_user_dir(named: &Path) -> (PathBuf, bool) {
    if holds_earlier_layout(named) && legacy_is_safe(named).is_ok() {
        (named.to_path_buf(), true)
    } else {
        (named.join(SUBDIR), false)
    }
}

/// Why a named directory that holds an earlier version's layout is not used as it is, for a
/// warning at start-up; `None` when there is nothing to say.
pub fn ignored_earlier_layout(named: &Path) -> Option<String> {
    if !holds_earlier_layout(named) {
        return None;
    }
    legacy_is_safe(named).err().map(|why| {
        format!(
            "{} holds files of an earlier bucketdrive version, but {why}: they are left alone, \
             and {} is used instead",
            named.display(),
            named.join(SUBDIR).display()
        )
    })
}

/// Makes sure the root `root` exists before [`CacheDir::open`] does (the detached mount's log
/// file lives there and is opened first), with the same checks; an earlier layout in place is
/// left as it is.
pub fn ensure_root(root: &Path) -> Result<(), String> {
    if holds_earlier_layout(root) && legacy_is_safe(root).is_ok() {
        return Ok(());
    }
    platform::create_private_dir(root)
        .map_err(|e| format!("cannot use cache directory {}: {e}", root.display()))
}

fn holds_earlier_layout(dir: &Path) -> bool {
    !dir.join(SUBDIR).exists()
        && (dir.join("mount-id").is_file()
            || dir.join("journal").is_dir()
            || dir.join("staging").is_dir())
}

/// An earlier layout is used in place only if the directory is ours and no one else can
/// write to it (the earlier versions made it 0700); otherwise anyone could have planted those
/// files, in `/tmp` say.
fn legacy_is_safe(dir: &Path) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(dir).map_err(|e| e.to_string())?;
        // SAFETY: geteuid cannot fail.
        if meta.uid() != unsafe { libc::geteuid() } {
            return Err(format!("it belongs to user {}", meta.uid()));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(format!(
                "others may write to it (mode {:o})",
                meta.mode() & 0o7777
            ));
        }
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
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

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn a_named_shared_dir_keeps_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let (root, legacy) = in_user_dir(&shared);
        assert_eq!(root, shared.join(SUBDIR));
        assert!(!legacy);
        let c = CacheDir::open(&root).unwrap();
        assert_eq!(
            mode(&shared),
            0o1777,
            "the named directory is not ours to change"
        );
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(&root.join("staging")), 0o700);
        drop(c);
        // A named directory that does not exist yet is made private, with ours inside.
        let fresh = dir.path().join("a/b");
        let (root, _) = in_user_dir(&fresh);
        CacheDir::open(&root).unwrap();
        assert_eq!(mode(&fresh), 0o700);
    }

    #[test]
    fn our_directories_are_narrowed_and_links_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("c");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        drop(CacheDir::open(&root).unwrap());
        assert_eq!(mode(&root), 0o700);

        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o755)).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        let err = CacheDir::open(&link).unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");
        assert_eq!(
            mode(&elsewhere),
            0o755,
            "nothing was changed through the link"
        );
        assert!(!elsewhere.join("staging").exists());

        // A staging directory swapped for a link is refused too.
        let root2 = dir.path().join("c2");
        std::fs::create_dir(&root2).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root2.join("staging")).unwrap();
        let err = CacheDir::open(&root2).unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");
    }

    #[test]
    fn a_directory_of_someone_else_is_refused() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root to give a directory away");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("c");
        std::fs::create_dir(&root).unwrap();
        std::os::unix::fs::chown(&root, Some(4321), None).unwrap();
        let err = CacheDir::open(&root).unwrap_err();
        assert!(err.contains("belongs to user 4321"), "{err}");
        // An earlier layout in someone else's directory is not used in place.
        std::fs::create_dir(root.join("journal")).unwrap();
        let (r, legacy) = in_user_dir(&root);
        assert!(!legacy);
        assert_eq!(r, root.join(SUBDIR));
        assert!(ignored_earlier_layout(&root).is_some());
    }

    #[test]
    fn an_earlier_layout_is_used_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let named = dir.path().join("old");
        // What an earlier version left: the directory itself as the root.
        let tag = {
            let c = CacheDir::open(&named).unwrap();
            std::fs::write(c.staging_path(7), b"staged").unwrap();
            c.tag().to_string()
        };
        std::fs::set_permissions(&named, std::fs::Permissions::from_mode(0o750)).unwrap();
        let (root, legacy) = in_user_dir(&named);
        assert_eq!(root, named);
        assert!(legacy);
        assert!(ignored_earlier_layout(&named).is_none());
        let c = CacheDir::open_at(&root, legacy).unwrap();
        assert_eq!(c.tag(), tag, "the same tag, so its parts are recognised");
        assert_eq!(c.staging_ids().unwrap().0, vec![7]);
        assert_eq!(mode(&named), 0o750, "left as it is");
        assert!(!named.join(SUBDIR).exists());
        drop(c);

        // Writable by others: anyone could have planted those files; not used.
        std::fs::set_permissions(&named, std::fs::Permissions::from_mode(0o777)).unwrap();
        let (root, legacy) = in_user_dir(&named);
        assert_eq!(root, named.join(SUBDIR));
        assert!(!legacy);
        let note = ignored_earlier_layout(&named).unwrap();
        assert!(note.contains("others may write"), "{note}");
    }

    #[test]
    fn default_dirs_differ_per_mount() {
        let a = default_cache_dir("b", "", Path::new("/mnt/a"));
        let b = default_cache_dir("b", "", Path::new("/mnt/b"));
        assert_ne!(a, b);
        assert!(a.to_string_lossy().contains("bucketdrive"));
    }
}
