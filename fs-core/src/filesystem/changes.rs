//! Namespace changes: mkdir, rmdir, unlink, rename of files and directories, and symbolic
//! links. They go straight to the bucket.
//!
//! A change that touches a file being written first pauses its uploads and waits for any in
//! flight, so an upload can never land under a name just deleted or renamed away (I3). The
//! staged state changes only after the bucket did: a failed delete leaves the pending version
//! where it was.
//!
//! A bucket is shared, so every delete and every copy over a name carries the generation this
//! mount saw there (I8, see [`crate::write::name_changes`]): its own lookup's or listing's, or,
//! for a file being written, an object the item owns. Another writer's object that the mount
//! never saw is left as it is: `rm` of the name still succeeds here (and says so in the log),
//! and a rename over it saves ours beside it as a conflict copy.
//!
//! A `mkdir` marker (like an exclusive create's claim) is made only if the name is free, and
//! carries a token of the request, so a retry after a lost answer knows its own marker from
//! another machine's (I12).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use futures::StreamExt;

use super::Filesystem;
use crate::error::{FsError, FsResult};
use crate::namespace::{names, Attr, Entry, Ino, Kind};
use crate::store::{
    mtime_metadata, ListRequest, ObjectMeta, ObjectStore, Precondition, StoreErrorKind,
    WriteOptions, RENAME_KEY, SYMLINK_KEY, WRITER_KEY,
};
use crate::write::upload::conflict_key;
use crate::write::writeback::WriteBack;

/// Whether `key`, a child of a delimited listing of `prefix` (an object, or a prefix ending in
/// `/`), is a name this system can show in that directory.
fn showable(prefix: &str, key: &str) -> bool {
    let rest = key.strip_prefix(prefix).unwrap_or(key);
    let name = rest.strip_suffix('/').unwrap_or(rest);
    names::check_component(name).is_ok()
}

impl<S: ObjectStore> Filesystem<S> {
    /// `Exists` if anything (in the bucket or being written) has the name `path`.
    async fn ensure_absent(&self, path: &str) -> FsResult<()> {
        match self.entry_at(path).await {
            Ok(_) => Err(FsError::Exists),
            Err(FsError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Creates a directory: a marker object `dir/`, made only if no marker is there. One name
    /// made on two machines at once goes to one of them; the other gets `Exists` (I12).
    pub async fn mkdir(&self, parent: Ino, name: &str) -> FsResult<Attr> {
        self.writer()?;
        let path = self.new_child_path(parent, name)?;
        let _making = self.claiming.take(&path).ok_or(FsError::Exists)?;
        self.ensure_absent(&path).await?;
        self.put_marked(&path, true).await?;
        self.ns.note(&path, Entry::Dir);
        self.ns.note_empty_dir(&path);
        Ok(self.ns.register(&path, &Entry::Dir, 1))
    }

    /// Puts an empty object at `path` (its directory marker with `dir`) only if the name is
    /// free (`ifGenerationMatch=0`), marked ([`WRITER_KEY`]) with this mount's tag and a token
    /// of this one request: a directory marker, or an exclusive create's claim. A failure is
    /// checked before it is believed: the object there carrying our token is our own write
    /// whose answer was lost (success); anything else, another machine's empty object too, is
    /// someone else's (`Exists`, and the caches learn what is there).
    pub(super) async fn put_marked(&self, path: &str, dir: bool) -> FsResult<ObjectMeta> {
        let key = match dir {
            true => format!("{}/", self.ns.key_of(path)),
            false => self.ns.key_of(path),
        };
        let token = format!("{}.{:016x}", self.writer()?.tag(), rand::random::<u64>());
        let opts = WriteOptions {
            metadata: HashMap::from([(WRITER_KEY.to_string(), token.clone())]),
            ..WriteOptions::default()
        };
        let store = self.ns.store();
        let err = match store
            .put(&key, Bytes::new(), Precondition::DoesNotExist, &opts)
            .await
        {
            Ok(m) => return Ok(m),
            Err(e) if e.kind == StoreErrorKind::PreconditionFailed || e.is_retryable() => e,
            Err(e) => return Err(e.into()),
        };
        let taken = err.kind == StoreErrorKind::PreconditionFailed;
        match store.head(&key).await {
            Ok(m) if m.size == 0 && m.metadata.get(WRITER_KEY) == Some(&token) => {
                tracing::info!(key = %key, "our own write whose answer was lost is in the bucket");
                Ok(m)
            }
            Ok(m) => {
                tracing::debug!(key = %key, "the name was taken in the bucket meanwhile");
                let entry = if dir {
                    Entry::Dir
                } else {
                    Entry::File(Arc::new(m))
                };
                self.ns.note(path, entry);
                Err(FsError::Exists)
            }
            // Taken when we asked, and gone again since.
            Err(h) if taken && h.kind == StoreErrorKind::NotFound => {
                self.ns.forget_tree(path);
                Err(FsError::Exists)
            }
            Err(_) => Err(err.into()),
        }
    }

    /// Whether the directory at `path` has anything in it, in the bucket or being written.
    async fn dir_has_children(&self, path: &str) -> FsResult<bool> {
        let prefix = format!("{}/", self.ns.key_of(path));
        if self
            .write
            .as_ref()
            .is_some_and(|w| w.has_local_under(&prefix))
        {
            return Ok(true);
        }
        let req = ListRequest {
            prefix: prefix.clone(),
            delimiter: Some("/".into()),
            max_results: Some(2),
            page_token: None,
        };
        let page = self.ns.store().list(&req).await?;
        let children: Vec<&str> = page
            .prefixes
            .iter()
            .map(String::as_str)
            .chain(page.objects.iter().map(|o| o.key.as_str()))
            .filter(|k| *k != prefix)
            .collect();
        if !children.is_empty() && children.iter().all(|k| !showable(&prefix, k)) {
            // The directory lists as empty, yet it is not: say why, naming some of the
            // objects (not the prefixes the delimiter folds them into), or `rmdir` would fail
            // with ENOTEMPTY forever and nothing to go on.
            let req = ListRequest {
                prefix: prefix.clone(),
                delimiter: None,
                max_results: Some(10),
                page_token: None,
            };
            let keys: Vec<String> = match self.ns.store().list(&req).await {
                Ok(all) => all
                    .objects
                    .into_iter()
                    .map(|o| o.key)
                    .filter(|k| *k != prefix)
                    .collect(),
                Err(_) => children.iter().map(|k| k.to_string()).collect(),
            };
            tracing::warn!(
                dir = %path,
                ?keys,
                "the directory is not empty: it holds objects whose names this system cannot show (an empty, '.' or '..' component, or one too long); remove or rename them with another tool (gsutil, gcloud storage)"
            );
        }
        Ok(!children.is_empty())
    }

    pub async fn rmdir(&self, parent: Ino, name: &str) -> FsResult<()> {
        self.writer()?;
        let path = self.new_child_path(parent, name)?;
        match self.entry_at(&path).await? {
            Entry::File(_) => return Err(FsError::NotDir),
            Entry::Dir => {}
        }
        if self.dir_has_children(&path).await? {
            return Err(FsError::NotEmpty);
        }
        let marker = format!("{}/", self.ns.key_of(&path));
        match self.ns.store().delete(&marker, Precondition::None).await {
            Ok(()) => {}
            Err(e) if e.kind == StoreErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        self.ns.note_missing(&path);
        self.ns.detach(&path);
        Ok(())
    }

    /// Deletes a file, only as the generation this mount saw: a newer object written by
    /// someone else stays (and is shown again), and the unlink still succeeds. A file being
    /// written is paused first; its staged data is dropped only once the bucket's object is
    /// gone, so a failed delete loses nothing.
    pub async fn unlink(&self, parent: Ino, name: &str) -> FsResult<()> {
        let w = self.writer()?;
        let path = self.new_child_path(parent, name)?;
        let key = self.ns.key_of(&path);
        let paused = w.pause(&key).await;
        let result = self
            .unlink_paused(&path, &key, w.item(&key).is_some())
            .await;
        w.resume(paused).await;
        // Another writer's object may still be at the name: it stays in the bucket, but the
        // name is gone here, as the user asked, until the negative TTL lets it show.
        // Until then a save over the name must not take that object for one the user saw.
        result?;
        self.ns.note_missing(&path);
        self.ns.detach(&path);
        Ok(())
    }

    async fn unlink_paused(&self, path: &str, key: &str, staged: bool) -> FsResult<()> {
        let w = self.writer()?;
        w.settle_journal().await?;
        let target = if staged {
            // A file being written may have landed unseen (an answer lost): ask the bucket
            // itself, but delete only what is ours. The user sees the item at this name, so
            // any other object there is one this mount never saw.
            match self.fresh_entry(path).await? {
                Some(Entry::Dir) => return Err(FsError::IsDir),
                Some(Entry::File(m)) if w.owns(key, &m).await => Some(m),
                Some(Entry::File(m)) => {
                    tracing::warn!(key = %key, generation = m.generation, "another writer's object is at the name of a file deleted here; it was never seen here and is left as it is");
                    None
                }
                None => None,
            }
        } else {
            match self.ns.resolve(path).await {
                Ok(Entry::Dir) => return Err(FsError::IsDir),
                Ok(Entry::File(m)) if self.ns.saw(path, &m) => Some(m),
                Ok(Entry::File(m)) => {
                    tracing::warn!(key = %key, generation = m.generation, "the object at the name of a file deleted here was replaced by another writer since it was seen; it is left as it is");
                    None
                }
                Err(e) => return Err(e),
            }
        };
        let mut deleted = None;
        if let Some(m) = target {
            // False: replaced by another writer meanwhile; theirs stays.
            match self.delete_checked(&m).await {
                Ok(true) => deleted = Some(m),
                Ok(false) => {}
                Err(e) => {
                    self.ns.forget_outcome(path);
                    return Err(e);
                }
            }
        }
        if let Err(e) = w.unlink(key).await {
            // The file stays, staged, though its object is gone.
            if let Some(m) = &deleted {
                w.base_gone(key, m).await;
                self.ns.forget_outcome(path);
            }
            return Err(e);
        }
        Ok(())
    }

    /// The object at `path` as the bucket has it now, past every cache (`None`: none). Used
    /// for files being written: an upload of theirs may have landed although its answer was
    /// lost, which no cache knows.
    async fn fresh_entry(&self, path: &str) -> FsResult<Option<Entry>> {
        self.ns.forget_tree(path);
        match self.ns.store().head(&self.ns.key_of(path)).await {
            Ok(m) => Ok(Some(Entry::File(Arc::new(m)))),
            Err(e) if e.kind == StoreErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Renames a file (server-side copy, then delete of the source) or a directory (object by
    /// object, not atomic, up to the configured limit; beyond it `EXDEV`).
    pub async fn rename(
        &self,
        parent: Ino,
        name: &str,
        new_parent: Ino,
        new_name: &str,
    ) -> FsResult<()> {
        self.writer()?;
        let from = self.child_path(parent, name)?;
        Self::not_reserved(&from)?;
        let to = self.new_child_path(new_parent, new_name)?;
        if from == to {
            return Ok(());
        }
        match self.entry_at(&from).await? {
            Entry::Dir => self.rename_dir(&from, &to).await,
            Entry::File(_) => self.rename_file(&from, &to).await,
        }
    }

    async fn rename_file(&self, from: &str, to: &str) -> FsResult<()> {
        let w = self.writer()?;
        let (src_key, dst_key) = (self.ns.key_of(from), self.ns.key_of(to));
        // No upload of either name may start or land while the rename runs.
        let paused = (w.pause(&src_key).await, w.pause(&dst_key).await);
        let result = self
            .rename_file_paused(from, to, &src_key, &dst_key)
            .await
            .map(|copied| {
                // Still paused: the renamed file's view rests on its copy at the new name
                // (when there is one) before an upload there can land and move it along.
                self.ns.rename_inode(from, to, copied.as_ref());
            });
        w.resume(paused.0).await;
        w.resume(paused.1).await;
        if result.is_err() {
            // Part of it may have happened: both names are asked about again.
            self.ns.forget_outcome(from);
            self.ns.forget_outcome(to);
        }
        result
    }

    async fn rename_file_paused(
        &self,
        from: &str,
        to: &str,
        src_key: &str,
        dst_key: &str,
    ) -> FsResult<Option<Arc<ObjectMeta>>> {
        let w = self.writer()?;
        w.settle_journal().await?;
        let (src_key, dst_key) = (src_key.to_string(), dst_key.to_string());
        let src_local = w.item(&src_key).is_some();
        let dst_local = w.item(&dst_key).is_some();
        // The source: for a file being written, only an object of its own (anything else at
        // the name is another writer's, never seen here, and stays where it is).
        let src_meta = match self.file_meta(from, src_local).await? {
            Some(Entry::Dir) => return Err(FsError::IsDir),
            Some(Entry::File(m)) if !src_local && !self.ns.saw(from, &m) => {
                // The file the user sees there was replaced by another writer since: theirs
                // is not ours to move, and ours is gone.
                tracing::warn!(key = %src_key, generation = m.generation, "the file renamed here was replaced by another writer since it was seen; theirs is left as it is");
                return Err(FsError::Stale);
            }
            Some(Entry::File(m)) if !src_local || w.owns(&src_key, &m).await => Some(m),
            Some(Entry::File(m)) => {
                tracing::warn!(key = %src_key, generation = m.generation, "another writer's object is at the name of a file renamed here; it was never seen here and is left as it is");
                None
            }
            None => None,
        };
        // The target: the generation this mount saw there, which is all a rename may replace.
        let dst_seen = match self.file_meta(to, dst_local).await? {
            Some(Entry::Dir) => return Err(FsError::IsDir),
            // What the kernel's view of the target rests on, if it has one: a generation
            // replaced since must not be replaced by us.
            Some(Entry::File(m)) if !dst_local => self.ns.seen_at(to, &m),
            found => {
                let fresh = match &found {
                    Some(Entry::File(m)) => Some(m.as_ref()),
                    _ => None,
                };
                w.seen_generation(&dst_key, fresh).await
            }
        };
        if src_meta.is_none() && !src_local {
            return Err(FsError::NotFound);
        }
        if let Some(item) = w.item(&src_key) {
            // What was written to the source becomes a version before the rename, as ext4
            // does for a rename over a file: the "write a temporary, rename it over" save never
            // leaves the target empty or old after a crash.
            if let Err(e) = w.commit(&item).await {
                tracing::warn!(key = %src_key, error = %e, "could not save the file before renaming it; its unsaved changes follow it");
            }
        }
        if src_local && src_meta.is_none() && !w.is_whole(&src_key).await {
            // Some of the file's bytes are still only in the object it was opened from, and
            // another writer replaced or removed that object (the commit above could not read
            // them back either): the file cannot be made whole under any name. As for a file
            // with no local bytes, the rename fails as stale.
            tracing::warn!(key = %src_key, "the file renamed here rests on an object another writer replaced or removed, and holds only some of its bytes; it is not moved");
            return Err(FsError::Stale);
        }
        // A source with a version still to upload: the bucket's object under the old name is
        // an older version of ours, not what the file holds. Its copy would only stand at the
        // target (or as a conflict copy) until the upload replaced it: move the version alone,
        // then delete the old object.
        if let Some(m) = src_meta.as_ref() {
            if w.has_whole_pending(&src_key).await {
                w.rename(&src_key, &dst_key, dst_seen, None).await?;
                self.delete_checked(m).await?;
                self.ns.forget_tree(to);
                self.ns.note_missing(from);
                return Ok(None);
            }
        }
        let mut made = None;
        match &src_meta {
            Some(m) => {
                let pre =
                    dst_seen.map_or(Precondition::DoesNotExist, Precondition::GenerationMatch);
                let copied = match self.copy_checked(m, &dst_key, pre, None).await {
                    Ok(c) => c,
                    Err(FsError::Stale) => {
                        self.rename_beside(from, to, m, &src_key, &dst_key).await?;
                        return Ok(None);
                    }
                    Err(e) => return Err(e),
                };
                // False: another writer replaced the source meanwhile, and theirs stays.
                // A failure leaves the copy: both names hold the file (see rename_dir_paused
                // for why a copy is never taken back after a failed delete).
                let deleted = self.delete_checked(m).await?;
                // Whatever item holds the source now moves (one may have been made during the
                // pause); without one, an item of the replaced target goes.
                if w.item(&src_key).is_some() {
                    let moved = w
                        .rename(&src_key, &dst_key, Some(copied.generation), Some(m))
                        .await;
                    if let Err(e) = moved {
                        // The copy stands at the target, the file stays staged at the source
                        // (nothing lost): its object there is gone.
                        if deleted {
                            w.base_gone(&src_key, m).await;
                        }
                        self.ns.forget_outcome(from);
                        self.ns.forget_outcome(to);
                        return Err(e);
                    }
                } else {
                    w.unlink(&dst_key).await?;
                }
                let copied = Arc::new(copied);
                self.ns.note(to, Entry::File(copied.clone()));
                made = Some(copied);
            }
            None => {
                // Only staged so far: the pending upload follows the new name, replacing only
                // what this mount saw there (else it is saved beside it as a conflict copy).
                w.rename(&src_key, &dst_key, dst_seen, None).await?;
                self.ns.forget_tree(to);
            }
        }
        // As for an unlink: another writer's object left at the source stays in the bucket,
        // and the name is gone here.
        self.ns.note_missing(from);
        Ok(made)
    }

    /// A rename whose target holds an object this mount never saw (someone else wrote it): it
    /// stays, and the source goes beside it as a conflict copy of the target's name. The
    /// rename succeeds for the user: the source name is gone, and nothing is lost.
    async fn rename_beside(
        &self,
        from: &str,
        to: &str,
        src: &ObjectMeta,
        src_key: &str,
        dst_key: &str,
    ) -> FsResult<()> {
        let w = self.writer()?;
        let saved_path = conflict_key(to, crate::clock::now(), w.tag());
        let saved_key = self.ns.key_of(&saved_path);
        tracing::error!(key = %dst_key, saved_as = %saved_key, "conflict: another writer's object is at the target of a rename; it is left as it is and the renamed file was saved beside it");
        let copied = self
            .copy_checked(src, &saved_key, Precondition::DoesNotExist, None)
            .await?;
        let deleted = self.delete_checked(src).await?;
        if w.item(src_key).is_some() {
            let moved = w
                .rename(src_key, &saved_key, Some(copied.generation), Some(src))
                .await;
            if let Err(e) = moved {
                // As for a rename over a seen target: the copy stands, the file stays staged
                // at the source, whose object is gone.
                if deleted {
                    w.base_gone(src_key, src).await;
                }
                self.ns.forget_outcome(from);
                self.ns.forget_outcome(&saved_path);
                return Err(e);
            }
        }
        // The user's own file at the target, if any, was replaced by the rename.
        w.unlink(dst_key).await?;
        w.note_conflict();
        self.ns.note(&saved_path, Entry::File(Arc::new(copied)));
        self.ns.forget_outcome(to);
        self.ns.note_missing(from);
        Ok(())
    }

    /// The file at `path`, read past the caches when it is being written (it may have landed
    /// unseen).
    async fn file_meta(&self, path: &str, staged: bool) -> FsResult<Option<Entry>> {
        if staged {
            return self.fresh_entry(path).await;
        }
        match self.ns.resolve(path).await {
            Ok(e) => Ok(Some(e)),
            Err(FsError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Deletes the object `m` (that generation only). Returns false when the name holds a
    /// newer object someone else wrote, which is left as it is (I8). A failure is checked
    /// before it is believed: when a try landed and only its answer was lost, the object is
    /// gone, and that is success.
    async fn delete_checked(&self, m: &ObjectMeta) -> FsResult<bool> {
        let store = self.ns.store();
        match store
            .delete(&m.key, Precondition::GenerationMatch(m.generation))
            .await
        {
            Ok(()) => Ok(true),
            Err(e) if e.kind == StoreErrorKind::NotFound => Ok(true),
            Err(e) if e.kind == StoreErrorKind::PreconditionFailed => {
                tracing::warn!(key = %m.key, generation = m.generation, "another writer replaced the object since it was seen here; the newer object is left as it is");
                Ok(false)
            }
            Err(e) if e.is_retryable() => match store.head(&m.key).await {
                Err(h) if h.kind == StoreErrorKind::NotFound => Ok(true),
                Ok(h) if h.generation != m.generation => Ok(false),
                _ => Err(e.into()),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// Server-side copy of `src` to `dest`. A failure is checked before it is believed: when a
    /// try landed and only its answer was lost (the retry then fails its precondition, or the
    /// retries run out), the object at `dest` already holds `src`'s bytes, and that is success.
    /// With `mark` (a directory rename's token, see [`RENAME_KEY`]) the copy carries it, and
    /// only an object carrying it is taken for ours: what this returns is then this request's
    /// own copy, never an identical one another writer made.
    async fn copy_checked(
        &self,
        src: &ObjectMeta,
        dest: &str,
        pre: Precondition,
        mark: Option<&str>,
    ) -> FsResult<ObjectMeta> {
        let err = match self
            .ns
            .store()
            .copy(&src.key, src.generation, dest, pre, mark)
            .await
        {
            Ok(m) => return Ok(m),
            Err(e) if e.kind == StoreErrorKind::PreconditionFailed || e.is_retryable() => e,
            Err(e) => return Err(e.into()),
        };
        match self.ns.store().head(dest).await {
            Ok(m) if is_copy_of(&m, src) && carries(&m, mark) => Ok(m),
            // Someone else's object, or none: the precondition failed against another writer.
            Ok(_) => Err(stale_or(err)),
            Err(h) if h.kind == StoreErrorKind::NotFound => Err(stale_or(err)),
            // Unknown whether the copy landed: a failure, never taken for another writer's
            // object (that would save a needless conflict copy of our own copy).
            Err(h) => Err(h.into()),
        }
    }

    /// One object of a directory rename: its marked copy at `dest`, or beside another
    /// writer's object there as a conflict copy. The name last tried, and the copy.
    async fn copy_or_beside(
        &self,
        o: &ObjectMeta,
        dest: String,
        pre: Precondition,
        mark_for: &impl Fn(&str) -> String,
        w: &WriteBack<S>,
    ) -> (String, FsResult<ObjectMeta>) {
        match self
            .copy_checked(o, &dest, pre, Some(&mark_for(&dest)))
            .await
        {
            Err(FsError::Stale) => {
                let saved_as = conflict_key(&dest, crate::clock::now(), w.tag());
                tracing::error!(key = %dest, saved_as = %saved_as, "conflict: another writer put an object under the target of a directory rename; it is left as it is and ours was saved beside it");
                w.note_conflict();
                let mark = mark_for(&saved_as);
                let result = self
                    .copy_checked(o, &saved_as, Precondition::DoesNotExist, Some(&mark))
                    .await;
                (saved_as, result)
            }
            other => (dest, other),
        }
    }

    /// Moves every object under the directory, and the files being written under it. Their
    /// uploads are paused for the whole move, so none lands under the old name.
    async fn rename_dir(&self, from: &str, to: &str) -> FsResult<()> {
        let w = self.writer()?;
        let src_prefix = format!("{}/", self.ns.key_of(from));
        let paused = w.pause_under(&src_prefix).await;
        let result = self.rename_dir_paused(from, to).await;
        if result.is_ok() {
            self.ns.rename_inode(from, to, None);
        }
        w.resume(paused).await;
        result
    }

    async fn rename_dir_paused(&self, from: &str, to: &str) -> FsResult<()> {
        let w = self.writer()?;
        w.settle_journal().await?;
        // An empty directory at the target is replaced; a failed rename must leave it there.
        let target_existed = match self.entry_at(to).await {
            Ok(Entry::File(_)) => return Err(FsError::NotDir),
            Ok(Entry::Dir) if self.dir_has_children(to).await? => return Err(FsError::NotEmpty),
            Ok(Entry::Dir) => true,
            Err(FsError::NotFound) => false,
            Err(e) => return Err(e),
        };
        let src_prefix = format!("{}/", self.ns.key_of(from));
        let dst_prefix = format!("{}/", self.ns.key_of(to));
        // Everything under the directory, at any depth; refuse before copying anything if it
        // is over the limit.
        let mut objects = Vec::new();
        let mut token = None;
        loop {
            let req = ListRequest {
                prefix: src_prefix.clone(),
                delimiter: None,
                page_token: token,
                max_results: Some(1000),
            };
            let page = self.ns.store().list(&req).await?;
            objects.extend(page.objects);
            if objects.len() > self.cfg.rename_dir_limit {
                return Err(FsError::CrossDevice);
            }
            token = page.next_page_token;
            if token.is_none() {
                break;
            }
        }
        // A file being written under the directory that holds only some of its bytes must find
        // the rest in its own object, listed here; if another writer replaced or removed that
        // object, it could never be read whole under the new name (as for a file rename).
        for (key, _) in w.local_under(&src_prefix) {
            if w.is_whole(&key).await {
                continue;
            }
            let based = match objects.iter().find(|o| o.key == key) {
                Some(o) => w.owns(&key, o).await,
                None => false,
            };
            if !based {
                tracing::warn!(key = %key, "a file under the directory renamed here rests on an object another writer replaced or removed, and holds only some of its bytes; nothing is moved");
                return Err(FsError::Stale);
            }
        }
        // Every copy carries this token: after a failure, only what carries it is taken back.
        // Another mount renaming the same directory at once makes identical copies; taking
        // one of those back could remove the only copy left once it deletes the source. The
        // mark names its destination too, so a copy of our copy made elsewhere meanwhile (a
        // `mv` on another mount) is not taken for ours.
        let token = format!("{}.{:016x}", w.tag(), rand::random::<u64>());
        let mark_for = |dest: &str| format!("{token}.{:08x}", crc32c::crc32c(dest.as_bytes()));
        // The copies go RENAME_PARALLEL at a time: each waits a round trip or two, and they do
        // not depend on each other. After a failure no new copy starts.
        let stop = AtomicBool::new(false);
        // The futures are made first: a stream that maps with a closure over borrowed objects
        // is not `Send` for every lifetime, as the adapters' spawned tasks need.
        let copies: Vec<_> = objects
            .iter()
            .map(|o| {
                let (stop, mark_for) = (&stop, &mark_for);
                let dest = format!("{dst_prefix}{}", &o.key[src_prefix.len()..]);
                // The target was empty or absent: anything under it now is another writer's,
                // never seen here, and is not replaced (I8). Only the marker of an empty
                // target may be.
                let pre = if target_existed && dest == dst_prefix {
                    Precondition::None
                } else {
                    Precondition::DoesNotExist
                };
                async move {
                    if stop.load(Ordering::Relaxed) {
                        return (o, dest, None);
                    }
                    let (tried, result) = self.copy_or_beside(o, dest, pre, mark_for, w).await;
                    if result.is_err() {
                        stop.store(true, Ordering::Relaxed);
                    }
                    (o, tried, Some(result))
                }
            })
            .collect();
        let attempts: Vec<(&ObjectMeta, String, Option<FsResult<ObjectMeta>>)> =
            futures::stream::iter(copies)
                .buffer_unordered(RENAME_PARALLEL)
                .collect()
                .await;
        let mut copied: HashMap<String, ObjectMeta> = HashMap::new();
        let mut failed = Vec::new();
        for (o, tried, result) in attempts {
            match result {
                Some(Ok(meta)) => {
                    copied.insert(o.key.clone(), meta);
                }
                Some(Err(e)) => failed.push((o, tried, e)),
                None => {}
            }
        }
        if !failed.is_empty() {
            // Nothing is deleted yet: take the copies back, so a failed rename leaves the
            // directory where it was (what cannot be taken back is logged).
            let marker = dst_prefix.as_str();
            for meta in copied
                .values()
                .filter(|m| !(target_existed && m.key == marker))
            {
                if let Err(d) = self.delete_checked(meta).await {
                    tracing::warn!(key = %meta.key, error = %d, "could not take back a copy of a failed directory rename");
                }
            }
            // A copy that failed may have landed with only its answer lost.
            for (o, tried, _) in failed
                .iter()
                .filter(|(_, t, _)| !(target_existed && t == marker))
            {
                match self.ns.store().head(tried).await {
                    // Ours only if it carries this rename's token.
                    Ok(m) if is_copy_of(&m, o) && carries(&m, Some(&mark_for(tried))) => {
                        if let Err(d) = self.delete_checked(&m).await {
                            tracing::warn!(key = %m.key, error = %d, "could not take back a copy of a failed directory rename");
                        }
                    }
                    Ok(_) => {}
                    Err(h) if h.kind == StoreErrorKind::NotFound => {}
                    Err(h) => {
                        tracing::warn!(key = %tried, error = %h, "could not tell whether a copy of a failed directory rename landed");
                    }
                }
            }
            self.ns.forget_outcome(to);
            let (_, _, e) = failed.swap_remove(0);
            return Err(e);
        }
        // Past the point of no return: every object has its copy, so the move is finished
        // rather than left half done. A delete that still fails for a busy bucket after its
        // retries is tried again, in up to FINISH_ROUNDS more rounds a while apart, each
        // request of those with one retry only (a bucket still down then fails the rename
        // in seconds more, not in as many full runs of retries).
        let mut left: Vec<&ObjectMeta> = objects.iter().collect();
        let mut round = 0;
        while !left.is_empty() {
            let deletes: Vec<_> = left
                .iter()
                .map(|o| async move {
                    let delete = self.delete_checked(o);
                    let r = if round == 0 {
                        delete.await
                    } else {
                        crate::store::retry::with_fallback(delete).await
                    };
                    (*o, r)
                })
                .collect();
            let failed: Vec<(&ObjectMeta, FsError)> = futures::stream::iter(deletes)
                .buffer_unordered(RENAME_PARALLEL)
                .filter_map(|(o, r)| async move { r.err().map(|e| (o, e)) })
                .collect()
                .await;
            // The error told is one that made the rename stop: one not of a busy bucket if
            // there is one.
            let stop = (failed.iter())
                .find(|(_, e)| !matches!(e, FsError::Busy(_)))
                .or(failed.first().filter(|_| round == FINISH_ROUNDS));
            if let Some((_, e)) = stop {
                // Some objects are under each name. A delete that failed is never followed
                // by taking the copies back: it may still land (a request timed out on our
                // side can run on the server later), and then the copies would be all that
                // is left.
                self.ns.forget_outcome(from);
                self.ns.forget_outcome(to);
                return Err(e.clone());
            }
            if !failed.is_empty() {
                round += 1;
                tracing::warn!(from, to, left = failed.len(), round, "a directory rename's deletes failed after every copy landed; trying them again to finish the move");
                tokio::time::sleep(FINISH_PAUSE * round).await;
            }
            left = failed.into_iter().map(|(o, _)| o).collect();
        }
        for meta in copied.values() {
            self.ns.note_own(meta);
        }
        for (key, _) in w.local_under(&src_prefix) {
            let dest = format!("{dst_prefix}{}", &key[src_prefix.len()..]);
            let src = objects.iter().find(|o| o.key == key);
            // A file whose object went beside another writer's follows it there.
            let (dest, generation) = match copied.get(&key) {
                Some(m) => (m.key.clone(), Some(m.generation)),
                None => (dest, None),
            };
            w.rename(&key, &dest, generation, src).await?;
        }
        if !copied.contains_key(&src_prefix) {
            // Keep the new directory visible even if nothing of it is in the bucket yet.
            let _ = self
                .ns
                .store()
                .put(
                    &dst_prefix,
                    Bytes::new(),
                    Precondition::None,
                    &WriteOptions::default(),
                )
                .await;
        }
        self.ns.forget_tree(from);
        self.ns.forget_tree(to);
        // What is now known for certain: the directory is at its new name, and not at its old.
        self.ns.note(to, Entry::Dir);
        self.ns.note_missing(from);
        Ok(())
    }

    /// Creates a symbolic link: an empty object whose metadata holds the target (the format is
    /// gcsfuse's, see [`SYMLINK_KEY`] and docs/semantics.md).
    pub async fn symlink(&self, parent: Ino, name: &str, target: &str) -> FsResult<Attr> {
        self.writer()?;
        let path = self.new_child_path(parent, name)?;
        self.ensure_absent(&path).await?;
        let mut metadata: HashMap<String, String> =
            mtime_metadata(SystemTime::now()).into_iter().collect();
        metadata.insert(SYMLINK_KEY.to_string(), target.to_string());
        let opts = WriteOptions {
            metadata,
            ..WriteOptions::default()
        };
        let key = self.ns.key_of(&path);
        let meta = match self
            .ns
            .store()
            .put(&key, Bytes::new(), Precondition::DoesNotExist, &opts)
            .await
        {
            Ok(m) => m,
            // The name was free a moment ago: a link to the same target there now is our own
            // write whose answer was lost (the retry then found it).
            Err(e) if e.kind == StoreErrorKind::PreconditionFailed => {
                match self.ns.store().head(&key).await {
                    Ok(m)
                        if m.size == 0
                            && m.metadata.get(SYMLINK_KEY).map(String::as_str) == Some(target) =>
                    {
                        m
                    }
                    _ => return Err(FsError::Exists),
                }
            }
            Err(e) => return Err(e.into()),
        };
        let entry = Entry::File(Arc::new(meta));
        self.ns.note(&path, entry.clone());
        Ok(self.ns.register(&path, &entry, 1))
    }

    /// The target of the symbolic link `ino`.
    pub async fn readlink(&self, ino: Ino) -> FsResult<String> {
        let (path, kind) = self.ns.inode_path(ino)?;
        if kind != Kind::Symlink {
            return Err(FsError::NotSymlink);
        }
        match self.ns.resolve(&path).await? {
            Entry::File(m) => m
                .metadata
                .get(SYMLINK_KEY)
                .cloned()
                .ok_or(FsError::NotSymlink),
            Entry::Dir => Err(FsError::NotSymlink),
        }
    }
}

/// A copy's failure once the object at its target is known not to be the copy: another
/// writer's object when its precondition failed, else the failure itself.
fn stale_or(err: crate::store::StoreError) -> FsError {
    if err.kind == StoreErrorKind::PreconditionFailed {
        FsError::Stale
    } else {
        err.into()
    }
}

/// How many of a directory rename's copies (and then deletes) are in flight at once.
const RENAME_PARALLEL: usize = 8;

/// Whether `m` carries the token `mark` of a directory rename (true when there is none).
fn carries(m: &ObjectMeta, mark: Option<&str>) -> bool {
    mark.is_none_or(|t| m.metadata.get(RENAME_KEY).map(String::as_str) == Some(t))
}

/// Whether `m` is a copy of `src`. Every empty object has the same CRC32C and size: an empty
/// one is a copy only if it names the same writer as the source (another machine's claim is not
/// our copy).
fn is_copy_of(m: &ObjectMeta, src: &ObjectMeta) -> bool {
    m.size == src.size
        && m.crc32c.is_some()
        && m.crc32c == src.crc32c
        && (m.size > 0 || m.metadata.get(WRITER_KEY) == src.metadata.get(WRITER_KEY))
}

/// Rounds of deletes a directory rename tries past its point of no return (every copy landed)
/// after the first, while the bucket answers that it is busy (each request in them retried
/// once), so a short outage does not leave the directory's objects under both names.
const FINISH_ROUNDS: u32 = 3;

/// The pause before the next such round, times the round's number.
const FINISH_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);
