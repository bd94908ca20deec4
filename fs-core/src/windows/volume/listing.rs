//! The Windows names of directories, kept between calls.
//!
//! Windows resolves names case-insensitively, so a lookup that misses the exact object name
//! needs the directory's names under one folding ([`fold`]); Explorer also probes names such
//! as `desktop.ini` in every folder it shows. A directory's [`Listing`] is therefore kept for
//! the negative TTL and answers "no such name in any case" the way a negative cache entry
//! does.
//!
//! The volume's own creates, renames and deletes edit a kept listing in place instead of
//! dropping it: WinFsp runs them under its volume-wide exclusive lock, and Explorer copying N
//! files into a folder must not list it N times. An edit made while the same directory is
//! being listed is recorded and replayed onto the new listing before it is kept, so a listing
//! that started before a create can never hide the created name for a whole TTL (a second
//! create of the name in another case would then make a duplicate object).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{fold, to_windows, Attr, MAX_NAME_UNITS, MAX_PATH_UNITS};

/// One name in a [`Listing`].
#[derive(Clone)]
pub(super) struct ListedName {
    /// The name Windows sees.
    pub win: String,
    pub object: String,
    pub attr: Attr,
}

/// A directory's entries under their Windows names, keyed by the folded Windows name, which
/// is unique in a directory ([`directory_names`] makes it so) and sorts the way Windows
/// enumerates: by the folded name.
#[derive(Clone)]
pub(super) struct Listing {
    pub entries: BTreeMap<String, ListedName>,
    /// Object name → its key in `entries`.
    by_object: HashMap<String, String>,
    /// Some names got a ` (case N)` suffix. Which one does depends on the whole set, so an
    /// edit of such a directory drops the listing instead of patching it (rare: only buckets
    /// written by case-sensitive tools have such names).
    suffixed: bool,
    fetched: Instant,
}

impl Listing {
    /// A listing of `names` (object name, Windows name, attributes), as
    /// [`super::directory_names`] named them; `suffixed` if that gave any name in the
    /// directory a case suffix, shown or not.
    pub fn new(names: impl IntoIterator<Item = (String, String, Attr)>, suffixed: bool) -> Self {
        let mut listing = Listing {
            entries: BTreeMap::new(),
            by_object: HashMap::new(),
            suffixed,
            fetched: Instant::now(),
        };
        for (object, win, attr) in names {
            let key = fold(&win);
            listing.by_object.insert(object.clone(), key.clone());
            listing
                .entries
                .insert(key, ListedName { win, object, attr });
        }
        listing
    }

    /// Applies one edit; false if the listing can no longer be kept current by patching.
    fn apply(&mut self, edit: &Edit) -> bool {
        match edit {
            Edit::Insert {
                dir_units,
                object,
                attr,
            } => self.insert(*dir_units, object, attr.clone()),
            Edit::Remove(object) => self.remove(object),
            Edit::Drop => false,
        }
    }

    /// Adds `object` (new in the directory). False if the listing can no longer be kept
    /// current by patching.
    pub fn insert(&mut self, dir_units: usize, object: &str, attr: Attr) -> bool {
        if self.suffixed {
            return false;
        }
        self.remove(object);
        let win = to_windows(object);
        if !shown(dir_units, &win) {
            return true;
        }
        let key = fold(&win);
        if self.entries.contains_key(&key) {
            // It would take a suffix: let the next listing decide which name gets it.
            return false;
        }
        self.by_object.insert(object.to_string(), key.clone());
        self.entries.insert(
            key,
            ListedName {
                win,
                object: object.to_string(),
                attr,
            },
        );
        true
    }

    /// Removes `object` if it is listed. False if the listing can no longer be kept current.
    pub fn remove(&mut self, object: &str) -> bool {
        if self.suffixed {
            return false;
        }
        if let Some(key) = self.by_object.remove(object) {
            self.entries.remove(&key);
        }
        true
    }

    /// The object shown under a Windows name, in any case.
    pub fn object_of(&self, win_name: &str) -> Option<&ListedName> {
        self.entries.get(&fold(win_name))
    }

    /// The name an object is shown under.
    pub fn win_of(&self, object: &str) -> Option<&str> {
        let key = self.by_object.get(object)?;
        self.entries.get(key).map(|n| n.win.as_str())
    }
}

/// How fresh a listing must be to answer.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Age {
    /// Within the listing TTL.
    Fresh,
    /// Listed now (a new enumeration, a delete check).
    Now,
    /// Any age: an enumeration paging on through the listing it started.
    Any,
}

/// Whether a name fits Windows' limits in a directory whose path is `dir_units` long.
pub(super) fn shown(dir_units: usize, win: &str) -> bool {
    let units = utf16_len(win);
    units <= MAX_NAME_UNITS && dir_units + units <= MAX_PATH_UNITS
}

pub(super) fn utf16_len(s: &str) -> usize {
    s.encode_utf16().count()
}

/// One change this volume made to a directory.
#[derive(Clone)]
pub(super) enum Edit {
    /// An object appeared (created, or renamed there); `dir_units` is the directory's path
    /// length, for the name limits.
    Insert {
        dir_units: usize,
        object: String,
        attr: Attr,
    },
    /// An object left (deleted, or renamed away).
    Remove(String),
    /// Something changed that a patch cannot describe: list again.
    Drop,
}

/// Directories being listed now: how many listings are under way, and the edits made since
/// the oldest of them began.
#[derive(Default)]
struct Building {
    count: usize,
    edits: Vec<Edit>,
}

#[derive(Default)]
struct State {
    listings: HashMap<String, Arc<Listing>>,
    building: HashMap<String, Building>,
}

/// The kept listings of one volume, by directory object path.
pub(super) struct Kept {
    state: Mutex<State>,
    ttl: Duration,
}

impl Kept {
    pub fn new(ttl: Duration) -> Self {
        Kept {
            state: Mutex::default(),
            ttl,
        }
    }

    /// The kept listing of `dir`, if it is fresh enough.
    pub fn get(&self, dir: &str, age: Age) -> Option<Arc<Listing>> {
        let state = self.state.lock();
        let l = state.listings.get(dir)?;
        let ok = match age {
            Age::Now => false,
            Age::Fresh => l.fetched.elapsed() < self.ttl,
            Age::Any => true,
        };
        ok.then(|| l.clone())
    }

    /// Records an edit of `dir`: patched into its kept listing (dropped if it cannot be), and
    /// remembered for listings of it under way.
    pub fn edit(&self, dir: &str, edit: Edit) {
        let mut state = self.state.lock();
        if let Some(b) = state.building.get_mut(dir) {
            b.edits.push(edit.clone());
        }
        if let Some(l) = state.listings.get_mut(dir) {
            if !Arc::make_mut(l).apply(&edit) {
                state.listings.remove(dir);
            }
        }
    }

    /// Drops the listings of a directory that moved or went, and of everything under it.
    pub fn drop_tree(&self, dir: &str) {
        let inside = format!("{dir}/");
        let mut state = self.state.lock();
        let under = |k: &str| k == dir || k.starts_with(&inside);
        for (k, b) in state.building.iter_mut() {
            if under(k) {
                b.edits.push(Edit::Drop);
            }
        }
        state.listings.retain(|k, _| !under(k));
    }

    /// Starts listing `dir`: edits from now on are replayed onto what it finds.
    pub fn begin(&self, dir: &str) -> Build<'_> {
        let mut state = self.state.lock();
        let b = state.building.entry(dir.to_string()).or_default();
        b.count += 1;
        Build {
            kept: self,
            dir: dir.to_string(),
            from: b.edits.len(),
        }
    }
}

/// A listing under way (see [`Kept::begin`]). Dropped without [`Build::finish`] (an error, or
/// a cancelled call), it only stops recording.
pub(super) struct Build<'a> {
    kept: &'a Kept,
    dir: String,
    from: usize,
}

impl Build<'_> {
    /// Replays the edits made since the listing began onto `listing`, and keeps it unless one
    /// of them could not be patched in. Returns it either way: it answers the call at hand.
    pub fn finish(self, mut listing: Listing) -> Arc<Listing> {
        let mut state = self.kept.state.lock();
        let edits = state
            .building
            .get(&self.dir)
            .map(|b| b.edits[self.from..].to_vec())
            .unwrap_or_default();
        let mut keep = true;
        for e in &edits {
            if !listing.apply(e) {
                keep = false;
                break;
            }
        }
        let listing = Arc::new(listing);
        if keep {
            state.listings.insert(self.dir.clone(), listing.clone());
        } else {
            state.listings.remove(&self.dir);
        }
        // Before `self` drops, which takes the lock again.
        drop(state);
        listing
    }
}

impl Drop for Build<'_> {
    fn drop(&mut self) {
        let mut state = self.kept.state.lock();
        if let Some(b) = state.building.get_mut(&self.dir) {
            b.count -= 1;
            if b.count == 0 {
                state.building.remove(&self.dir);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::namespace::Kind;

    fn attr(ino: u64) -> Attr {
        Attr {
            ino,
            kind: Kind::File,
            size: 1,
            mtime: SystemTime::UNIX_EPOCH,
            perm: 0o644,
            uid: 0,
            gid: 0,
            generation: 1,
            ttl: std::time::Duration::ZERO,
        }
    }

    fn listing(objects: &[&str]) -> Listing {
        Listing::new(
            objects
                .iter()
                .enumerate()
                .map(|(i, o)| (o.to_string(), to_windows(o), attr(i as u64 + 10))),
            false,
        )
    }

    fn names(l: &Listing) -> Vec<String> {
        l.entries.values().map(|n| n.win.clone()).collect()
    }

    fn insert(object: &str) -> Edit {
        Edit::Insert {
            dir_units: 1,
            object: object.to_string(),
            attr: attr(99),
        }
    }

    #[test]
    fn edits_patch_a_kept_listing_in_place() {
        let kept = Kept::new(Duration::from_secs(60));
        kept.begin("d").finish(listing(&["a", "b"]));
        kept.edit("d", insert("C"));
        kept.edit("d", Edit::Remove("a".into()));
        let l = kept.get("d", Age::Fresh).expect("still kept");
        assert_eq!(names(&l), vec!["b", "C"]);
        assert_eq!(l.object_of("c").map(|n| n.object.as_str()), Some("C"));
        assert!(l.object_of("A").is_none());
        // A name that would collide in another case cannot be patched in: listed again.
        kept.edit("d", insert("B"));
        assert!(kept.get("d", Age::Any).is_none());
    }

    /// A create while the directory is being listed: the listing began before the name
    /// existed, so it does not show it; the edit is replayed onto it before it is kept.
    #[test]
    fn an_edit_during_a_listing_is_replayed_onto_it() {
        let kept = Kept::new(Duration::from_secs(60));
        let build = kept.begin("d");
        kept.edit("d", insert("new.txt"));
        kept.edit("d", Edit::Remove("gone.txt".into()));
        let l = build.finish(listing(&["gone.txt", "old.txt"]));
        assert_eq!(names(&l), vec!["new.txt", "old.txt"]);
        let l = kept.get("d", Age::Fresh).expect("kept");
        assert_eq!(names(&l), vec!["new.txt", "old.txt"]);
        // Two listings under way: each replays what happened since it began.
        let first = kept.begin("d");
        kept.edit("d", insert("x"));
        let second = kept.begin("d");
        kept.edit("d", insert("y"));
        let l2 = second.finish(listing(&["x"]));
        assert_eq!(names(&l2), vec!["x", "y"]);
        let l1 = first.finish(listing(&[]));
        assert_eq!(names(&l1), vec!["x", "y"]);
        // A folder that moved while being listed is not kept.
        let build = kept.begin("d/sub");
        kept.drop_tree("d");
        build.finish(listing(&["z"]));
        assert!(kept.get("d/sub", Age::Any).is_none());
        assert!(kept.get("d", Age::Any).is_none());
        // Nothing is recorded once no listing is under way.
        assert!(kept.state.lock().building.is_empty());
    }

    #[test]
    fn a_listing_dropped_unfinished_stops_recording() {
        let kept = Kept::new(Duration::from_secs(60));
        drop(kept.begin("d"));
        kept.edit("d", insert("a"));
        assert!(kept.state.lock().building.is_empty());
        assert!(kept.get("d", Age::Any).is_none());
    }
}
