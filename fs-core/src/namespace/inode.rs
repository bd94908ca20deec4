//! The inode table: stable numbers for paths, and the kernel's lookup counts.
//!
//! Every path the kernel has been told about has one inode number until the kernel forgets it.
//! Numbers are never reused within a mount, so a stale kernel reference can never reach a
//! different file. A path that changes kind (a file replaced by a directory of the same name)
//! gets a new number, because the kernel must not see an inode change type.
//!
//! A file replaced in the bucket by someone else also gets a new number, whatever its size.
//! With the write-back cache the kernel trusts its own size and modification time for a cached
//! file inode and ignores the ones we report, so the only way to show it a new size or time is
//! a new inode (a same-size replacement that kept the old time would make `rsync -a` skip the
//! file). Each file inode remembers its *basis*: the generation and size the kernel's view was
//! built from. Our own writes move the basis along (the kernel made those changes itself); a
//! foreign new generation detaches the old number.

use std::collections::HashMap;
use std::sync::Arc;

use crate::store::ObjectMeta;

pub type Ino = u64;
pub const ROOT_INO: Ino = 1;

/// File, directory or symbolic link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    File,
    Dir,
    Symlink,
}

/// One inode.
#[derive(Debug, Clone)]
pub struct Inode {
    pub path: String,
    pub kind: Kind,
    /// How many times the kernel has been handed this inode and not yet forgotten it.
    pub lookups: u64,
    /// Latest metadata seen for a file.
    pub meta: Option<Arc<ObjectMeta>>,
    /// Generation and size the kernel's view of this file was built from: the generation this
    /// mount saw or uploaded there (kept while the file is being written here; 0: it has none
    /// under this name yet). `None` right after a rename, until the next lookup.
    pub basis: Option<(i64, u64)>,
    /// Generation served by the most recent open, to decide whether the kernel's page cache for
    /// this inode is still valid.
    pub last_open_generation: Option<i64>,
    /// The name was unlinked or replaced: the kernel may still hold this number, but it no
    /// longer names anything, so late requests on it (a deferred time update, say) must not
    /// land on whatever now has the name.
    pub detached: bool,
}

impl Inode {
    /// Whether `m` is someone else's replacement of the object the kernel's view was built
    /// from (a new generation, of any size).
    pub fn replaced_by_others(&self, m: &ObjectMeta) -> bool {
        match self.basis {
            Some((generation, _)) => {
                generation > 0 && m.generation > 0 && m.generation != generation
            }
            None => false,
        }
    }

    /// Records fresh metadata. `ours` says the change came through this mount, so the kernel
    /// already has it; a local file (generation 0) is always ours.
    pub fn observe(&mut self, m: &Arc<ObjectMeta>, ours: bool) {
        if m.generation == 0 {
            // The view is the file being written here; the bucket generation it was last seen
            // or uploaded at is still what this mount saw there (I8).
            let seen = self.basis.map_or(0, |(g, _)| g);
            self.basis = Some((seen, m.size));
        } else if ours || !self.replaced_by_others(m) {
            self.basis = Some((m.generation, m.size));
        }
        self.meta = Some(m.clone());
    }
}

/// All inodes of one mount.
#[derive(Debug)]
pub struct InodeTable {
    by_ino: HashMap<Ino, Inode>,
    by_path: HashMap<String, Ino>,
    next: Ino,
}

impl Default for InodeTable {
    fn default() -> Self {
        Self::new()
    }
}

impl InodeTable {
    pub fn new() -> Self {
        let mut t = InodeTable {
            by_ino: HashMap::new(),
            by_path: HashMap::new(),
            next: ROOT_INO + 1,
        };
        let root = Inode {
            path: String::new(),
            kind: Kind::Dir,
            lookups: 1,
            meta: None,
            basis: None,
            last_open_generation: None,
            detached: false,
        };
        t.by_ino.insert(ROOT_INO, root);
        t.by_path.insert(String::new(), ROOT_INO);
        t
    }

    pub fn get(&self, ino: Ino) -> Option<&Inode> {
        self.by_ino.get(&ino)
    }

    pub fn get_mut(&mut self, ino: Ino) -> Option<&mut Inode> {
        self.by_ino.get_mut(&ino)
    }

    /// The inode for `path` as `kind`, created if needed, with its metadata refreshed. Adds
    /// `add_lookups` to its lookup count.
    pub fn upsert(
        &mut self,
        path: &str,
        kind: Kind,
        meta: Option<Arc<ObjectMeta>>,
        add_lookups: u64,
    ) -> Ino {
        if let Some(&ino) = self.by_path.get(path) {
            if let Some(inode) = self.by_ino.get_mut(&ino) {
                if inode.kind == kind
                    && !meta.as_deref().is_some_and(|m| inode.replaced_by_others(m))
                {
                    if let Some(m) = &meta {
                        inode.observe(m, false);
                    }
                    inode.lookups += add_lookups;
                    return ino;
                }
            }
            // Kind or size changed behind our back: detach the old number; the kernel will
            // forget it in time.
            self.detach(path);
        }
        let ino = self.next;
        self.next += 1;
        self.by_ino.insert(
            ino,
            Inode {
                path: path.to_string(),
                kind,
                lookups: add_lookups,
                basis: meta.as_deref().map(|m| (m.generation, m.size)),
                meta,
                last_open_generation: None,
                detached: false,
            },
        );
        self.by_path.insert(path.to_string(), ino);
        ino
    }

    /// Moves the inode at `from`, and every inode below it, to `to` (a rename), detaching
    /// whatever those new paths named before. The kernel keeps its dentries for the children of
    /// a renamed directory, so their inodes must answer to the new paths.
    pub fn rename(&mut self, from: &str, to: &str, copied: Option<&Arc<ObjectMeta>>) {
        if from == to {
            return;
        }
        // The target's inode goes even when the source has none (never looked up): the name
        // must not keep answering with the inode of the file it replaced, which a handle may
        // still hold open.
        self.detach(to);
        let from_dir = format!("{from}/");
        let moved: Vec<(String, Ino)> = self
            .by_path
            .iter()
            .filter(|(p, _)| *p == from || p.starts_with(&from_dir))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        for (old, _) in &moved {
            self.by_path.remove(old);
        }
        for (old, ino) in moved {
            let new = format!("{to}{}", &old[from.len()..]);
            self.detach(&new);
            if let Some(i) = self.by_ino.get_mut(&ino) {
                i.path = new.clone();
                i.last_open_generation = None;
                // The object at the new name is a copy, a new generation of the same bytes:
                // the renamed file's view rests on it (or, without one, on what the next
                // lookup finds).
                i.basis = copied
                    .filter(|_| i.kind == Kind::File && new == to)
                    .map(|m| (m.generation, m.size));
            }
            self.by_path.insert(new, ino);
        }
    }

    /// `path` no longer names its inode (unlinked, or replaced by a rename).
    pub fn detach(&mut self, path: &str) {
        if let Some(ino) = self.by_path.remove(path) {
            if let Some(i) = self.by_ino.get_mut(&ino) {
                i.detached = true;
            }
        }
    }

    /// Our upload of `path` landed as `m`: the kernel's view now rests on that generation.
    pub fn settled(&mut self, path: &str, m: &Arc<ObjectMeta>) {
        if let Some(ino) = self.by_path.get(path) {
            if let Some(i) = self.by_ino.get_mut(ino) {
                i.observe(m, true);
            }
        }
    }

    /// The bucket generation the kernel's view of the file at `path` rests on, if the kernel
    /// was told of one (a file written here and not yet uploaded under this name has none).
    pub fn basis_at(&self, path: &str) -> Option<i64> {
        self.view_at(path).flatten()
    }

    /// What the kernel's view at `path` rests on: `None` when there is no view to go by (no
    /// inode there, or one whose basis is unknown, as after a directory rename), `Some(None)`
    /// for one that rests on no bucket object (a file written here and not yet uploaded under
    /// this name), `Some(Some(g))` for generation `g`.
    pub fn view_at(&self, path: &str) -> Option<Option<i64>> {
        let ino = self.by_path.get(path)?;
        let inode = self.by_ino.get(ino).filter(|i| !i.detached)?;
        let (g, _) = inode.basis?;
        Some((g > 0).then_some(g))
    }

    /// The inode the kernel knows at `path`, if any.
    pub fn ino_at(&self, path: &str) -> Option<Ino> {
        let ino = self.by_path.get(path)?;
        self.by_ino.get(ino).filter(|i| !i.detached).map(|_| *ino)
    }

    /// Adds to the lookup count of an existing inode.
    pub fn add_lookup(&mut self, ino: Ino) {
        if let Some(i) = self.by_ino.get_mut(&ino) {
            i.lookups += 1;
        }
    }

    /// The kernel dropped `n` references. The inode goes away when none remain.
    pub fn forget(&mut self, ino: Ino, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        let Some(inode) = self.by_ino.get_mut(&ino) else {
            return;
        };
        inode.lookups = inode.lookups.saturating_sub(n);
        if inode.lookups == 0 {
            let path = inode.path.clone();
            self.by_ino.remove(&ino);
            if self.by_path.get(&path) == Some(&ino) {
                self.by_path.remove(&path);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.by_ino.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_ino.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_numbers_and_forget() {
        let mut t = InodeTable::new();
        let a = t.upsert("a", Kind::File, None, 1);
        assert_eq!(t.upsert("a", Kind::File, None, 1), a);
        assert_eq!(t.get(a).unwrap().lookups, 2);
        t.forget(a, 1);
        assert!(t.get(a).is_some());
        t.forget(a, 1);
        assert!(t.get(a).is_none());
        let a2 = t.upsert("a", Kind::File, None, 1);
        assert_ne!(a, a2, "numbers are never reused");
        t.forget(ROOT_INO, 100);
        assert!(t.get(ROOT_INO).is_some());
    }

    #[test]
    fn rename_moves_descendants() {
        let mut t = InodeTable::new();
        let d = t.upsert("a/b", Kind::Dir, None, 1);
        let f = t.upsert("a/b/c/f", Kind::File, None, 1);
        let other = t.upsert("a/bb", Kind::File, None, 1);
        t.rename("a/b", "x", None);
        assert_eq!(t.get(d).unwrap().path, "x");
        assert_eq!(t.get(f).unwrap().path, "x/c/f");
        assert_eq!(
            t.get(other).unwrap().path,
            "a/bb",
            "a sibling with a common prefix stays"
        );
        assert_eq!(t.upsert("x/c/f", Kind::File, None, 0), f);
    }

    #[test]
    fn kind_change_gets_new_number() {
        let mut t = InodeTable::new();
        let f = t.upsert("x", Kind::File, None, 1);
        let d = t.upsert("x", Kind::Dir, None, 1);
        assert_ne!(f, d);
        // The old number stays valid for the kernel until forgotten, and forgetting it does not
        // disturb the new mapping.
        assert_eq!(t.get(f).unwrap().kind, Kind::File);
        t.forget(f, 1);
        assert_eq!(t.upsert("x", Kind::Dir, None, 0), d);
    }
}
