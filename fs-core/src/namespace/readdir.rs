//! Streaming a directory out of a delimited listing, one page at a time.
//!
//! A directory is the set of objects and common prefixes directly under its prefix, from
//! `list(prefix, delimiter="/")`. A listing holds at most one page (plus a handful of deferred
//! names, see below), so a directory of 100,000 objects lists in memory bounded by a page.
//!
//! When both `foo` and `foo/` exist, the directory wins. GCS orders a listing by bytes, so the
//! prefix `foo/` may arrive on a later page than the object `foo` (anything like `foo.txt` sorts
//! between them). An object is therefore held back while its `/`-suffixed name sorts after
//! everything the page covered, and decided against the next page. Only names that are a
//! prefix of the page's last key can be held, so the carry stays tiny.

use std::collections::HashSet;

use crate::namespace::names::check_component;
use crate::store::{ListRequest, ObjectMeta, ObjectStore, StoreResult};

/// Names per listing request.
pub const PAGE_SIZE: u32 = 1000;

/// One child found by a listing.
#[derive(Debug, Clone)]
pub enum Listed {
    Dir(String),
    File(String, ObjectMeta),
}

/// The state of one pass over a directory.
#[derive(Debug)]
pub struct Listing {
    prefix: String,
    token: Option<String>,
    done: bool,
    carry: Vec<ObjectMeta>,
    warned_bad: bool,
    page_size: u32,
}

impl Listing {
    /// A listing of the objects under `prefix` (empty, or ending in `/`).
    pub fn new(prefix: String) -> Self {
        Listing {
            prefix,
            token: None,
            done: false,
            carry: Vec::new(),
            warned_bad: false,
            page_size: PAGE_SIZE,
        }
    }

    /// Uses smaller pages; for tests of pagination.
    pub fn with_page_size(mut self, n: u32) -> Self {
        self.page_size = n.max(1);
        self
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Ends the pass without asking the bucket for more (it was answered another way).
    pub fn finish(&mut self) {
        self.done = true;
        self.carry.clear();
    }

    /// Fetches the next page and returns the children it settles. `on_shadowed` is told the key
    /// of each object hidden by a directory of the same name.
    pub async fn next_page<S: ObjectStore + ?Sized>(
        &mut self,
        store: &S,
        on_shadowed: &(dyn Fn(&str) + Sync),
    ) -> StoreResult<Vec<Listed>> {
        if self.done {
            return Ok(Vec::new());
        }
        let req = ListRequest {
            prefix: self.prefix.clone(),
            delimiter: Some("/".into()),
            page_token: self.token.clone(),
            max_results: Some(self.page_size),
        };
        let page = store.list(&req).await?;
        self.token = page.next_page_token.clone();
        self.done = self.token.is_none();

        let last_key = page
            .objects
            .iter()
            .map(|o| o.key.as_str())
            .chain(page.prefixes.iter().map(String::as_str))
            .max()
            .unwrap_or("")
            .to_string();
        let dirs: HashSet<&str> = page
            .prefixes
            .iter()
            .filter_map(|p| p.strip_prefix(&self.prefix))
            .filter_map(|p| p.strip_suffix('/'))
            .collect();

        let mut out = Vec::with_capacity(page.objects.len() + page.prefixes.len());
        let mut carry = Vec::new();
        let mut bad = 0usize;
        let files = std::mem::take(&mut self.carry)
            .into_iter()
            .chain(page.objects.iter().cloned());
        for obj in files {
            let Some(name) = obj.key.strip_prefix(&self.prefix) else {
                continue;
            };
            if name.is_empty() {
                continue; // the directory's own marker object
            }
            if check_component(name).is_err() {
                bad += 1;
                continue;
            }
            if dirs.contains(name) {
                on_shadowed(&obj.key);
                continue;
            }
            if !self.done && format!("{}/", obj.key) > last_key {
                carry.push(obj);
                continue;
            }
            // Kept as the caches keep objects: without metadata nobody here reads.
            out.push(Listed::File(name.to_string(), obj.trimmed()));
        }
        for name in &dirs {
            if check_component(name).is_err() {
                bad += 1;
            } else {
                out.push(Listed::Dir(name.to_string()));
            }
        }
        // Prefixes such as "dir//" give an empty name; they never reach `dirs` as valid.
        bad += page
            .prefixes
            .iter()
            .filter_map(|p| p.strip_prefix(&self.prefix))
            .filter(|p| p.strip_suffix('/').is_none_or(|n| n.is_empty()))
            .count();
        self.carry = carry;
        if bad > 0 && !self.warned_bad {
            self.warned_bad = true;
            tracing::warn!(
                prefix = %self.prefix,
                "skipping object names that cannot be path components (empty, '.', '..', NUL, over 255 bytes, or from '//')"
            );
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use parking_lot::Mutex;

    async fn list_all(
        store: &MemoryStore,
        prefix: &str,
        page: u32,
    ) -> (Vec<String>, Vec<String>, Vec<String>) {
        let mut l = Listing::new(prefix.into()).with_page_size(page);
        let shadowed = Mutex::new(Vec::new());
        let mut files = Vec::new();
        let mut dirs = Vec::new();
        while !l.is_done() {
            for e in l
                .next_page(store, &|k| shadowed.lock().push(k.to_string()))
                .await
                .unwrap()
            {
                match e {
                    Listed::Dir(n) => dirs.push(n),
                    Listed::File(n, _) => files.push(n),
                }
            }
        }
        files.sort();
        dirs.sort();
        (files, dirs, shadowed.into_inner())
    }

    #[tokio::test]
    async fn implicit_and_marker_dirs() {
        let s = MemoryStore::new();
        s.insert("top/implicit/deep/file", "x");
        s.insert("top/marker/", "");
        s.insert("top/f", "x");
        s.insert("top/", "");
        let (files, dirs, _) = list_all(&s, "top/", 1000).await;
        assert_eq!(files, vec!["f"]);
        assert_eq!(dirs, vec!["implicit", "marker"]);
    }

    #[tokio::test]
    async fn directory_shadows_file_across_pages() {
        for page in [1, 2, 3, 1000] {
            let s = MemoryStore::new();
            s.insert("foo", "file");
            s.insert("foo.txt", "x");
            s.insert("foo-bar", "x");
            s.insert("foo/inner", "x");
            s.insert("zed", "x");
            let (files, dirs, shadowed) = list_all(&s, "", page).await;
            assert_eq!(files, vec!["foo-bar", "foo.txt", "zed"], "page size {page}");
            assert_eq!(dirs, vec!["foo"], "page size {page}");
            assert_eq!(shadowed, vec!["foo"], "page size {page}");
        }
    }

    #[tokio::test]
    async fn unrepresentable_names_skipped() {
        let s = MemoryStore::new();
        s.insert("d/ok", "x");
        s.insert("d//empty", "x");
        s.insert("d/./x", "x");
        s.insert("d/../x", "x");
        s.insert("d/.", "x");
        s.insert("d/..", "x");
        s.insert(&format!("d/{}", "n".repeat(256)), "x");
        s.insert("d/nul\0name", "x");
        let (files, dirs, _) = list_all(&s, "d/", 1000).await;
        assert_eq!(files, vec!["ok"]);
        assert!(dirs.is_empty(), "{dirs:?}");
    }

    #[tokio::test]
    async fn many_pages_list_everything_once() {
        let s = MemoryStore::new();
        for i in 0..2500 {
            s.insert(&format!("big/f{i:05}"), "x");
        }
        for i in 0..30 {
            s.insert(&format!("big/d{i:03}/x"), "x");
        }
        let (files, dirs, _) = list_all(&s, "big/", 97).await;
        assert_eq!(files.len(), 2500);
        assert_eq!(dirs.len(), 30);
        let unique: HashSet<_> = files.iter().collect();
        assert_eq!(unique.len(), 2500);
    }
}
