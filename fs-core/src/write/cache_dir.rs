//! The cache directory of one mount: where staged data and the journal live.
//!
//! Layout: `lock` (held with an exclusive file lock for the life of the mount, so two mounts can never share
//! one directory), `staging/<id>.data`, `journal/journal.log`, and `mount-id`, a random tag
//! made once per cache directory. Temporary part objects in the bucket are named under that
//! tag, so a mount can tell its own leftovers from another mount's in-flight work.
//! Directories are mode 0700 and files 0600: staged data is the user's data.
//!
//! Which directory is the root ([`CacheRoot`], decided once, before the mount starts): by
//! default one per bucket, prefix and mountpoint under the user's cache directory
//! ([`default_cache_dir`]). A directory the user names with `--cache-dir` is not ours: it may
//! be shared (`/tmp`), so its mode is never changed and the root is our own sub-directory
//! [`SUBDIR`] inside it ([`CacheRoot::in_user_dir`]). Every directory we own is checked when
//! opened: a real directory (not a symbolic link), owned by the effective user, narrowed to
//! 0700 through a descriptor ([`platform::create_private_dir`]).
//!
//! Earlier versions used a named directory itself as the root. One that still holds that
//! layout (`lock`, `staging/` and `journal/` directly in it: see `holds_earlier_layout`) is
//! used as it is, so what it has staged is replayed. The answer depends only on that layout,
//! never on whether [`SUBDIR`] exists (a detached mount may create it for its log before the
//! cache directory is opened), so it is the same at every start. Using it needs the directory
//! to be ours and writable by no one else; otherwise the mount is refused, since anyone could
//! have planted those files and skipping them would strand what was staged there. It is
//! refused too when [`SUBDIR`] holds journal records of its own: one of the two would be
//! ignored.

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

/// The name of staging file `id` in the staging directory.
pub fn staging_file_name(id: u64) -> String {
    format!("{id:016x}.data")
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
        self.staging_dir().join(staging_file_name(id))
    }

    pub fn staging_dir(&self) -> PathBuf {
        self.root.join("staging")
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

/// Where a mount's cache directory is. Decided once at start-up, before the log or anything
/// else creates a directory, so every user of the root (the log file, the write path, the
/// control socket) gets the same answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheRoot {
    pub path: PathBuf,
    /// `path` is a directory the user named that holds an earlier version's layout: used as
    /// it is, its own mode untouched.
    pub legacy: bool,
}

impl CacheRoot {
    /// The default root of a mount ([`default_cache_dir`]).
    pub fn default_for(bucket: &str, prefix: &str, mountpoint: &Path) -> Self {
        CacheRoot {
            path: default_cache_dir(bucket, prefix, mountpoint),
            legacy: false,
        }
    }

    /// The root inside `named`, a directory the user gave as `--cache-dir`: `named` itself
    /// when it holds an earlier version's layout that is safe to use, else `named/`[`SUBDIR`].
    /// Fails, with a one-line message saying what to do, when the earlier layout must not be
    /// used (someone else could write to it) or cannot be used alone ([`SUBDIR`] holds journal
    /// records too): going on would leave what one of them staged behind, unsaid. Only reads.
    pub fn in_user_dir(named: &Path) -> Result<Self, String> {
        let ours = named.join(SUBDIR);
        if !holds_earlier_layout(named) {
            return Ok(CacheRoot {
                path: ours,
                legacy: false,
            });
        }
        if let Err(why) = legacy_is_safe(named) {
            return Err(format!(
                "{dir} holds files staged by an earlier bucketdrive version, but {why}; make it \
                 yours and not group/other-writable (chmod go-w {dir}), or move those files \
                 (lock, mount-id, staging/, journal/) away",
                dir = named.display()
            ));
        }
        let journal = ours.join("journal");
        let both = super::journal::holds_records(&journal)
            .map_err(|e| format!("cannot read the journal in {}: {e}", journal.display()))?;
        if both {
            return Err(format!(
                "{dir} holds files staged by an earlier bucketdrive version, and {ours} holds \
                 files staged since: one would be ignored. Mount once with --cache-dir {ours} \
                 to upload those, then again with --cache-dir {dir}",
                dir = named.display(),
                ours = ours.display()
            ));
        }
        Ok(CacheRoot {
            path: named.to_path_buf(),
            legacy: true,
        })
    }

    /// Makes sure the root exists before [`CacheDir::open`] does (the detached mount's log
    /// file lives there and is opened first), with the same checks; an earlier layout in place
    /// is left as it is.
    pub fn ensure(&self) -> Result<(), String> {
        if self.legacy {
            return Ok(());
        }
        platform::create_private_dir(&self.path)
            .map_err(|e| format!("cannot use cache directory {}: {e}", self.path.display()))
    }
}

/// Whether `dir` holds the layout an earlier version left when it used a named directory
/// itself as the root. The marker is the three names every earlier version created on every
/// open, before anything was staged, and never removed: `staging/` and `journal/`, then the
/// `lock` file. Not `mount-id` (it came later) nor `journal/journal.log` (the first versions
/// kept one `journal/<id>.json` per record). All three are required: a directory of the
/// user's that merely has a `staging/` or `journal/` of its own must not be taken for ours,
/// since we would then write into it, narrow its sub-directories to 0700 and delete its files
/// named like staging files. Only names are looked at; whether the directory is safe to use is
/// [`legacy_is_safe`], and [`CacheDir::open_at`] refuses links and files not ours as usual.
fn holds_earlier_layout(dir: &Path) -> bool {
    dir.join("lock").is_file() && dir.join("staging").is_dir() && dir.join("journal").is_dir()
}

/// An earlier layout is used in place only if the directory is ours and no one else can
/// write to it (the earlier versions made it 0700); otherwise anyone could have planted those
/// files, in `/tmp` say.
fn legacy_is_safe(dir: &Path) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(dir).map_err(|e| format!("it cannot be read: {e}"))?;
        // SAFETY: geteuid cannot fail.
        if meta.uid() != unsafe { libc::geteuid() } {
            return Err(format!("it belongs to user {}", meta.uid()));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(format!(
                "others can write to it (mode {:o})",
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
        let CacheRoot { path: root, legacy } = CacheRoot::in_user_dir(&shared).unwrap();
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
        let root = CacheRoot::in_user_dir(&fresh).unwrap();
        assert!(!fresh.exists(), "deciding creates nothing");
        CacheDir::open(&root.path).unwrap();
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
        // An earlier layout in someone else's directory is neither used nor skipped.
        std::fs::create_dir(root.join("journal")).unwrap();
        std::fs::create_dir(root.join("staging")).unwrap();
        std::fs::write(root.join("lock"), b"").unwrap();
        let err = CacheRoot::in_user_dir(&root).unwrap_err();
        assert!(err.contains("belongs to user 4321"), "{err}");
        assert!(err.contains("make it yours"), "{err}");
    }

    /// Leaves in `named` what an earlier version left there: the directory itself as the
    /// root, with one file staged and journaled.
    fn earlier_layout(named: &Path) -> String {
        let c = CacheDir::open(named).unwrap();
        std::fs::write(c.staging_path(7), b"staged").unwrap();
        std::fs::write(c.journal_dir().join("journal.log"), b"a record\n").unwrap();
        c.tag().to_string()
    }

    #[test]
    fn an_earlier_layout_is_used_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let named = dir.path().join("old");
        let tag = earlier_layout(&named);
        std::fs::set_permissions(&named, std::fs::Permissions::from_mode(0o750)).unwrap();
        let root = CacheRoot::in_user_dir(&named).unwrap();
        assert_eq!(root.path, named);
        assert!(root.legacy);
        root.ensure().unwrap();
        let c = CacheDir::open_at(&root.path, root.legacy).unwrap();
        assert_eq!(c.tag(), tag, "the same tag, so its parts are recognised");
        assert_eq!(c.staging_ids().unwrap().0, vec![7]);
        assert_eq!(mode(&named), 0o750, "left as it is");
        assert!(!named.join(SUBDIR).exists());
    }

    #[test]
    fn the_first_versions_layout_is_recognised() {
        // Before `mount-id` and `journal.log`: `lock`, `staging/`, one file per record.
        let dir = tempfile::tempdir().unwrap();
        let named = dir.path().join("first");
        for d in ["staging", "journal"] {
            std::fs::create_dir_all(named.join(d)).unwrap();
        }
        std::fs::write(named.join("lock"), b"").unwrap();
        std::fs::write(named.join("journal").join("0000000000000001.json"), b"{}").unwrap();
        let root = CacheRoot::in_user_dir(&named).unwrap();
        assert_eq!(root.path, named);
        assert!(root.legacy);
    }

    #[test]
    fn the_decision_does_not_depend_on_the_sub_directory() {
        let dir = tempfile::tempdir().unwrap();
        let named = dir.path().join("old");
        earlier_layout(&named);
        let first = CacheRoot::in_user_dir(&named).unwrap();
        assert!(first.legacy);
        // What a detached mount's log leaves before the cache directory is opened: our
        // sub-directory, with a log file in it. Nothing changes, however often it is asked.
        let ours = named.join(SUBDIR);
        CacheRoot {
            path: ours.clone(),
            legacy: false,
        }
        .ensure()
        .unwrap();
        std::fs::write(ours.join("bucketdrive.log"), b"log\n").unwrap();
        for _ in 0..3 {
            assert_eq!(CacheRoot::in_user_dir(&named).unwrap(), first);
        }
        // Even a sub-directory used before, whose journal has nothing left to upload.
        drop(CacheDir::open(&ours).unwrap());
        std::fs::write(ours.join("journal").join("journal.log"), b"").unwrap();
        assert_eq!(CacheRoot::in_user_dir(&named).unwrap(), first);
    }

    #[test]
    fn an_earlier_layout_beside_a_used_sub_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let named = dir.path().join("old");
        earlier_layout(&named);
        let ours = named.join(SUBDIR);
        drop(CacheDir::open(&ours).unwrap());
        // A journal of the older form is enough to show a staged file.
        std::fs::write(ours.join("journal").join("0000000000000002.json"), b"{}").unwrap();
        let err = CacheRoot::in_user_dir(&named).unwrap_err();
        assert!(!err.contains('\n'), "one line: {err}");
        assert!(err.contains("one would be ignored"), "{err}");
        assert!(
            err.contains(&format!("--cache-dir {}", ours.display())),
            "{err}"
        );
        // What the message says: the sub-directory, named itself, is an earlier layout too.
        let sub = CacheRoot::in_user_dir(&ours).unwrap();
        assert_eq!(sub.path, ours);
        assert!(sub.legacy);
    }

    #[test]
    fn an_earlier_layout_others_may_write_to_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let named = dir.path().join("old");
        earlier_layout(&named);
        for m in [0o2770, 0o777, 0o1777] {
            std::fs::set_permissions(&named, std::fs::Permissions::from_mode(m)).unwrap();
            for _ in 0..2 {
                let err = CacheRoot::in_user_dir(&named).unwrap_err();
                assert!(!err.contains('\n'), "one line: {err}");
                assert!(err.contains(&format!("mode {m:o}")), "{err}");
                assert!(
                    err.contains(&format!("chmod go-w {}", named.display())),
                    "{err}"
                );
            }
            assert!(!named.join(SUBDIR).exists(), "deciding creates nothing");
            assert_eq!(mode(&named), m, "and changes nothing");
        }
        std::fs::set_permissions(&named, std::fs::Permissions::from_mode(0o2750)).unwrap();
        assert!(CacheRoot::in_user_dir(&named).unwrap().legacy);
    }

    #[test]
    fn an_ordinary_directory_is_not_an_earlier_layout() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        // A project with `staging/` and `journal/` of its own, and even a `mount-id`.
        for d in ["staging", "journal"] {
            std::fs::create_dir_all(work.join(d)).unwrap();
            std::fs::set_permissions(work.join(d), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let theirs = work.join("staging").join("0000000000000001.data");
        std::fs::write(&theirs, b"theirs").unwrap();
        std::fs::write(work.join("mount-id"), b"0123456789abcdef").unwrap();
        let root = CacheRoot::in_user_dir(&work).unwrap();
        assert_eq!(root.path, work.join(SUBDIR));
        assert!(!root.legacy);
        drop(CacheDir::open_at(&root.path, root.legacy).unwrap());
        assert!(theirs.exists());
        assert_eq!(mode(&work.join("staging")), 0o755, "theirs, left alone");
        assert!(!work.join("lock").exists());
        // `lock` with only one of the two directories is not it either.
        let half = dir.path().join("half");
        std::fs::create_dir_all(half.join("staging")).unwrap();
        std::fs::write(half.join("lock"), b"").unwrap();
        assert!(!CacheRoot::in_user_dir(&half).unwrap().legacy);
    }

    #[test]
    fn default_dirs_differ_per_mount() {
        let a = default_cache_dir("b", "", Path::new("/mnt/a"));
        let b = default_cache_dir("b", "", Path::new("/mnt/b"));
        assert_ne!(a, b);
        assert!(a.to_string_lossy().contains("bucketdrive"));
    }
}
