//! Attributes of files: size and modification time (`setattr`), and owner, group and mode
//! (`--posix-metadata`). A change to a file as it is in the bucket patches the object's
//! metadata in place; any other goes with the file's next upload.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use super::{FileIo, Filesystem};
use crate::error::{FsError, FsResult};
use crate::namespace::{Attr, Entry, Ino, Kind};
use crate::store::{mtime_metadata, ObjectMeta, ObjectStore, Posix, StoreErrorKind};
use crate::write::writeback::ItemRef;

impl<S: ObjectStore> Filesystem<S> {
    /// Changes size and/or modification time. chmod and chown are accepted and ignored by the
    /// adapters (see docs/semantics.md).
    pub async fn setattr(
        &self,
        ino: Ino,
        size: Option<u64>,
        mtime: Option<SystemTime>,
        fh: Option<u64>,
    ) -> FsResult<Attr> {
        tracing::debug!(ino, ?size, ?mtime, ?fh, "setattr");
        let (path, kind) = self.ns.inode_path(ino)?;
        if kind == Kind::Dir {
            if size.is_some() {
                return Err(FsError::IsDir);
            }
            return self.getattr(ino).await;
        }
        if kind == Kind::Symlink {
            // A link's own times and owner are accepted and ignored, like a directory's.
            return self.getattr(ino).await;
        }
        let current = self.getattr(ino).await?;
        // The kernel's write-back cache flushes an inode's times after writes and renames; a
        // time the file already has changes nothing. Compared exactly: the bucket keeps
        // nanoseconds, and a time that differs only below the second is a change (rsync and
        // robocopy set such times and compare them on their next run).
        let same_time = mtime.is_none_or(|t| t == current.mtime);
        if size.is_none() && same_time {
            return Ok(current);
        }
        let w = self.writer()?;
        let key = self.ns.key_of(&path);
        // Not while readers pass through the file (`ETXTBSY`, as for a program running).
        let _change = match size {
            Some(_) => Some(self.pt.begin_change(&key, Some(ino)).await?),
            None => None,
        };
        let (held, unchanged) = self.held_item(fh, &key).await?;
        if size.is_none() && unchanged {
            // Only the time of a file as it is in the bucket (`touch` opens it first): patch
            // its metadata, no upload.
            if let (Some(t), Ok(Entry::File(m))) = (mtime, self.ns.resolve(&path).await) {
                let md: HashMap<String, String> = mtime_metadata(t).into_iter().collect();
                return self.patch_metadata(ino, &path, &key, &m, &md).await;
            }
        }
        let (item, temporary) = match held {
            Some(item) => (item, false),
            None => (self.open_item(&path, &key, size == Some(0)).await?, true),
        };
        let result = async {
            if let Some(len) = size {
                w.truncate(&item, len).await?;
            }
            if let Some(t) = mtime {
                w.set_mtime(&item, t).await;
            }
            if temporary {
                w.close(&item).await?;
            }
            Ok::<(), FsError>(())
        }
        .await;
        if temporary {
            w.release(&item).await;
        }
        result?;
        self.getattr(ino).await
    }

    /// The writable item `fh` holds, if any, and whether the file is still as it is in the
    /// bucket (nothing changed through that item, or through any item of `key` without one).
    async fn held_item(&self, fh: Option<u64>, key: &str) -> FsResult<(Option<ItemRef>, bool)> {
        let w = self.writer()?;
        let held = fh
            .and_then(|fh| self.handle(fh).ok())
            .and_then(|f| match &f.io {
                FileIo::Staged {
                    item,
                    writable: true,
                } => Some(item.clone()),
                _ => None,
            });
        let unchanged = match &held {
            Some(item) => w.is_unchanged(item).await,
            None => w.key_unchanged(key).await,
        };
        Ok((held, unchanged))
    }

    /// chmod and chown. With `--posix-metadata` they are stored in `goog-reserved-posix-*`
    /// metadata (a metadata patch for a file in the bucket, or with the pending upload);
    /// otherwise, and for directories and links, they are accepted and ignored.
    ///
    /// Only what a file may show is stored: setuid, setgid and sticky are dropped unless
    /// `--posix-special-modes`, and an owner or group outside the mount's set is `EPERM`
    /// (stored, it would only show as the mount's own).
    pub async fn set_posix(&self, ino: Ino, posix: Posix, fh: Option<u64>) -> FsResult<Attr> {
        let (path, kind) = self.ns.inode_path(ino)?;
        if !self.cfg.posix_metadata || kind != Kind::File || posix.is_empty() {
            return self.getattr(ino).await;
        }
        let foreign_uid = posix.uid.filter(|u| !self.cfg.posix_uid_allowed(*u));
        let foreign_gid = posix.gid.filter(|g| !self.cfg.posix_gid_allowed(*g));
        if foreign_uid.is_some() || foreign_gid.is_some() {
            return Err(FsError::NotPermitted(format!(
                "owner {foreign_uid:?} / group {foreign_gid:?} is not one this mount shows \
                 (--uid, --gid, --posix-uids, --posix-gids)"
            )));
        }
        let posix = self.cfg.trusted_posix(posix);
        let w = self.writer()?;
        let key = self.ns.key_of(&path);
        let (held, unchanged) = self.held_item(fh, &key).await?;
        if unchanged {
            if let Entry::File(m) = self.ns.resolve(&path).await? {
                let mut md = HashMap::new();
                posix.to_metadata(&mut md);
                let attr = self.patch_metadata(ino, &path, &key, &m, &md).await?;
                w.note_patched(&key, posix).await;
                return Ok(attr);
            }
        }
        if let Some(item) = held {
            w.set_posix(&item, posix, true).await;
            return self.getattr(ino).await;
        }
        // Staged and not in the bucket yet: the change goes up with the file.
        let item = self.open_item(&path, &key, false).await?;
        w.set_posix(&item, posix, true).await;
        let closed = w.close(&item).await;
        w.release(&item).await;
        closed?;
        self.getattr(ino).await
    }

    /// Sets metadata of the object `m` at `path` in place.
    async fn patch_metadata(
        &self,
        ino: Ino,
        path: &str,
        key: &str,
        m: &ObjectMeta,
        md: &HashMap<String, String>,
    ) -> FsResult<Attr> {
        match self.ns.store().update_metadata(key, m.generation, md).await {
            Ok(new) => self.ns.note(path, Entry::File(Arc::new(new))),
            Err(e) if e.kind == StoreErrorKind::PreconditionFailed => {
                self.ns.forget_tree(path);
                return Err(FsError::Stale);
            }
            Err(e) => return Err(e.into()),
        }
        self.getattr(ino).await
    }
}
