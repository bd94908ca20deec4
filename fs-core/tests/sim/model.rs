//! The reference model of the simulation: what the user did and was told, per file identity.
//!
//! A file *identity* is one file as the user knows it: it keeps its identity across renames and
//! across writes through any of its handles. For each identity the model keeps the content the
//! user sees now (`current`), the last content acknowledged to the user by `close()`, `fsync()`
//! or a truncate (`acked`), and the contents committed by an operation that then failed, or seen
//! after a crash (`maybe`): those may legally end in the bucket instead of `acked`, being later
//! states of the file that contain every acknowledged write.
//!
//! Per object name it keeps every state any file had while it lived under that name (`history`),
//! so a check can tell whether the bytes in the bucket are some real state of the file or bytes
//! no version ever had. A name's history is forgotten when the name is deleted or renamed away,
//! so an old upload landing on a name taken by a new file is caught too.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::hash::{Hash as _, Hasher};

pub type FileId = u64;

/// A content fingerprint: length and a 64-bit hash.
pub type Digest = (usize, u64);

pub fn digest(data: &[u8]) -> Digest {
    // DefaultHasher::new() has fixed keys: the same bytes always give the same digest.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    data.hash(&mut h);
    (data.len(), h.finish())
}

#[derive(Debug, Clone)]
pub struct MFile {
    /// The content the user sees now.
    pub current: Vec<u8>,
    /// The last acknowledged content; None if never acknowledged (a new file not yet closed).
    pub acked: Option<Vec<u8>>,
    /// Later states that may have been made durable without the user being told.
    pub maybe: Vec<Vec<u8>>,
    /// Its name; None once unlinked or replaced while a handle was still open on it.
    pub path: Option<String>,
    /// The last state known durable against a power cut (fsync'd, or found after a restart).
    pub floor: Option<Vec<u8>>,
    /// States acknowledged since `floor`, oldest first, with the time of the close (ms of the
    /// incarnation; `u128::MAX` until stamped): a power cut may lose those closed less than a
    /// commit interval before it.
    pub recent: Vec<(u128, Vec<u8>)>,
}

impl MFile {
    /// Whether `data` is a state this file may legally have in the bucket after everything
    /// settled, or after a crash (besides the state it had at the crash).
    pub fn legal_final(&self, data: &[u8]) -> bool {
        self.acked.as_deref() == Some(data) || self.maybe.iter().any(|m| m == data)
    }

    /// The states a power cut at a time when everything closed up to `cutoff` (if any) is
    /// durable may leave: the newest of those, or any later acknowledged one (or one maybe committed).
    /// `None` in the list stands for no file at all.
    pub fn legal_after_power_cut(&self, cutoff: Option<u128>) -> Vec<Option<&[u8]>> {
        let from = cutoff.and_then(|c| self.recent.iter().rposition(|(t, _)| *t <= c));
        let mut legal: Vec<Option<&[u8]>> = match from {
            Some(k) => self.recent[k..].iter().map(|(_, s)| Some(&s[..])).collect(),
            None => std::iter::once(self.floor.as_deref())
                .chain(self.recent.iter().map(|(_, s)| Some(&s[..])))
                .collect(),
        };
        legal.extend(self.maybe.iter().map(|m| Some(&m[..])));
        legal
    }
}

#[derive(Debug, Default)]
pub struct Model {
    pub files: BTreeMap<FileId, MFile>,
    /// Live names (object keys) and the file at each.
    pub names: BTreeMap<String, FileId>,
    /// Live directories (top-level names).
    pub dirs: BTreeSet<String>,
    /// Every state any file had under each name, since the name was last deleted.
    pub history: BTreeMap<String, HashSet<Digest>>,
    /// Keys the bucket may still hold although the model says they are gone: the user was told
    /// the deletion failed, yet the filesystem shows the name as gone.
    pub stray_ok: BTreeSet<String>,
    next: FileId,
}

pub fn parent_of(path: &str) -> Option<&str> {
    path.rsplit_once('/').map(|(d, _)| d)
}

impl Model {
    pub fn live(&self, path: &str) -> Option<FileId> {
        self.names.get(path).copied()
    }

    pub fn file(&self, id: FileId) -> &MFile {
        &self.files[&id]
    }

    pub fn parent_exists(&self, path: &str) -> bool {
        parent_of(path).is_none_or(|d| self.dirs.contains(d))
    }

    pub fn dir_empty(&self, d: &str) -> bool {
        let prefix = format!("{d}/");
        !self.names.keys().any(|k| k.starts_with(&prefix))
    }

    /// A new file at `path` with `content`, acknowledged or not.
    pub fn add(&mut self, path: &str, content: Vec<u8>, acked: bool) -> FileId {
        let id = self.next;
        self.next += 1;
        self.stray_ok.remove(path);
        self.names.insert(path.to_string(), id);
        self.files.insert(
            id,
            MFile {
                acked: acked.then(|| content.clone()),
                floor: acked.then(|| content.clone()),
                recent: Vec::new(),
                current: content,
                maybe: Vec::new(),
                path: Some(path.to_string()),
            },
        );
        self.changed(id);
        id
    }

    /// The file's current content changed (or was made durable): remember it under its name.
    pub fn changed(&mut self, id: FileId) {
        let f = &self.files[&id];
        if let Some(p) = &f.path {
            self.history
                .entry(p.clone())
                .or_default()
                .insert(digest(&f.current));
        }
    }

    pub fn set_current(&mut self, id: FileId, data: Vec<u8>) {
        self.files.get_mut(&id).unwrap().current = data;
        self.changed(id);
    }

    /// A pwrite: bytes at `offset`, zeros in any gap before it.
    pub fn write(&mut self, id: FileId, offset: usize, data: &[u8]) {
        let f = self.files.get_mut(&id).unwrap();
        let end = offset + data.len();
        if f.current.len() < end {
            f.current.resize(end, 0);
        }
        f.current[offset..end].copy_from_slice(data);
        self.changed(id);
    }

    pub fn truncate(&mut self, id: FileId, len: usize) {
        self.files.get_mut(&id).unwrap().current.resize(len, 0);
        self.changed(id);
    }

    /// The current content was acknowledged.
    pub fn ack(&mut self, id: FileId) {
        let f = self.files.get_mut(&id).unwrap();
        if f.path.is_none() {
            return;
        }
        f.acked = Some(f.current.clone());
        f.maybe.clear();
        f.recent.push((u128::MAX, f.current.clone()));
        self.changed(id);
    }

    /// The last acknowledgement was a close (or a truncate) at `t`: durable against a power
    /// cut one commit interval later.
    pub fn stamp(&mut self, id: FileId, t: u128) {
        if let Some(last) = self.files.get_mut(&id).unwrap().recent.last_mut() {
            last.0 = t;
        }
    }

    /// The file's acknowledged state is durable against a power cut (an fsync, a restart).
    pub fn durable(&mut self, id: FileId) {
        let f = self.files.get_mut(&id).unwrap();
        f.floor = f.acked.clone();
        f.recent.clear();
    }

    /// The current content may have been made durable, but the user was told it failed.
    pub fn maybe(&mut self, id: FileId) {
        let f = self.files.get_mut(&id).unwrap();
        if f.path.is_none() {
            return;
        }
        if f.acked.as_ref() != Some(&f.current) && !f.maybe.contains(&f.current) {
            f.maybe.push(f.current.clone());
            // A power cut may also leave it (it may have been made durable), though it is
            // never the state every later one must contain.
            f.recent.push((u128::MAX, f.current.clone()));
        }
        self.changed(id);
    }

    /// The file at `path` is gone (unlinked, or replaced by a rename).
    pub fn detach(&mut self, path: &str) {
        if let Some(id) = self.names.remove(path) {
            self.files.get_mut(&id).unwrap().path = None;
        }
    }

    pub fn unlink(&mut self, path: &str) {
        self.detach(path);
        self.history.remove(path);
    }

    pub fn rename(&mut self, from: &str, to: &str) {
        let id = self.names.remove(from).expect("rename of a live file");
        self.detach(to);
        self.names.insert(to.to_string(), id);
        self.stray_ok.remove(to);
        self.files.get_mut(&id).unwrap().path = Some(to.to_string());
        // Whatever sat under `from` in the bucket may be what gets copied to `to`.
        let old = self.history.remove(from).unwrap_or_default();
        self.history.entry(to.to_string()).or_default().extend(old);
        self.changed(id);
    }

    pub fn rename_dir(&mut self, from: &str, to: &str) {
        let (pf, pt) = (format!("{from}/"), format!("{to}/"));
        let moved: Vec<String> = self
            .names
            .keys()
            .filter(|k| k.starts_with(&pf))
            .cloned()
            .collect();
        for k in moved {
            let dest = format!("{pt}{}", &k[pf.len()..]);
            self.rename(&k, &dest);
        }
        let old: Vec<String> = self
            .history
            .keys()
            .filter(|k| k.starts_with(&pf))
            .cloned()
            .collect();
        for k in old {
            self.history.remove(&k);
        }
        self.dirs.remove(from);
        self.dirs.insert(to.to_string());
    }

    /// Drops detached files no handle holds any more.
    pub fn gc(&mut self, held: &BTreeSet<FileId>) {
        self.files
            .retain(|id, f| f.path.is_some() || held.contains(id));
    }
}
