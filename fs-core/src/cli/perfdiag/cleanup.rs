//! The test objects' life: the unique temporary prefix they are written under, the record of
//! every name written, and deleting all of them at the end of a run, after an error, and after
//! Ctrl-C or SIGTERM.
//!
//! A name enters the record before its request is sent, so a write whose answer never came is
//! still known. Deleting trusts neither the record nor a listing alone: a write cancelled by a
//! signal may have landed without our hearing, or land a moment later, so the prefix is
//! listed, everything listed or recorded is deleted, and the prefix is listed again until it is
//! empty. Nothing outside the temporary prefix is ever deleted: every key is checked against it.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use parking_lot::Mutex;

use super::plan::DELETE_CONCURRENCY;
use crate::store::{ListRequest, ObjectStore, Precondition, StoreError, StoreErrorKind};

/// Listing and deleting rounds before the leftovers are reported.
const ROUNDS: usize = 4;

/// `PREFIX/bucketdrive-perfdiag-<UTC time>-<nonce>/`: unique per run, sorted by time, and
/// named so that whoever finds one left behind knows what made it.
pub fn temp_prefix(user_prefix: &str, now: SystemTime, nonce: u32) -> String {
    let stamp: String = humantime::format_rfc3339_seconds(now)
        .to_string()
        .chars()
        .filter(|c| !matches!(c, '-' | ':'))
        .collect();
    let user = user_prefix.trim_matches('/');
    let sep = if user.is_empty() { "" } else { "/" };
    format!("{user}{sep}bucketdrive-perfdiag-{stamp}-{nonce:08x}/")
}

/// Every name a run wrote under its temporary prefix and has not deleted yet.
#[derive(Debug)]
pub struct Written {
    bucket: String,
    root: String,
    keys: Mutex<BTreeSet<String>>,
    deleted: AtomicU64,
}

impl Written {
    /// A record for objects under `root` (a [`temp_prefix`]) of `bucket`.
    pub fn new(bucket: &str, root: &str) -> Self {
        Written {
            bucket: bucket.to_string(),
            root: root.to_string(),
            keys: Mutex::new(BTreeSet::new()),
            deleted: AtomicU64::new(0),
        }
    }

    /// The temporary prefix, ending in `/`.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// `gs://BUCKET/ROOT`, for messages.
    pub fn url(&self) -> String {
        format!("gs://{}/{}", self.bucket, self.root)
    }

    /// Records `key` (under the root) before the request that writes it is sent.
    pub fn add(&self, key: &str) {
        debug_assert!(key.starts_with(&self.root), "{key} outside {}", self.root);
        self.keys.lock().insert(key.to_string());
    }

    /// Objects deleted so far.
    pub fn deleted(&self) -> u64 {
        self.deleted.load(Ordering::SeqCst)
    }

    /// Names recorded and not yet deleted.
    pub fn pending(&self) -> Vec<String> {
        self.keys.lock().iter().cloned().collect()
    }

    fn forget(&self, key: &str, existed: bool) {
        self.keys.lock().remove(key);
        if existed {
            self.deleted.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Deletes `keys`, [`DELETE_CONCURRENCY`] at a time. A key that is already gone counts as
/// deleted (a retried delete whose first try landed finds nothing); keys outside the root are
/// skipped. Returns the failures.
pub async fn delete<S: ObjectStore + ?Sized>(
    store: &S,
    written: &Written,
    keys: Vec<String>,
) -> Vec<(String, StoreError)> {
    futures::stream::iter(keys.into_iter().filter(|k| k.starts_with(&written.root)))
        .map(|key| async move {
            match store.delete(&key, Precondition::None).await {
                Ok(()) => {
                    written.forget(&key, true);
                    None
                }
                Err(e) if e.kind == StoreErrorKind::NotFound => {
                    written.forget(&key, false);
                    None
                }
                Err(e) => Some((key, e)),
            }
        })
        .buffer_unordered(DELETE_CONCURRENCY)
        .filter_map(|r| async move { r })
        .collect()
        .await
}

/// Every object under `root`.
async fn list_under<S: ObjectStore + ?Sized>(
    store: &S,
    root: &str,
) -> Result<BTreeSet<String>, StoreError> {
    let mut out = BTreeSet::new();
    let mut token = None;
    loop {
        let page = store
            .list(&ListRequest {
                prefix: root.to_string(),
                delimiter: None,
                page_token: token,
                max_results: Some(1000),
            })
            .await?;
        out.extend(page.objects.into_iter().map(|o| o.key));
        token = page.next_page_token;
        if token.is_none() {
            return Ok(out);
        }
    }
}

/// Deletes everything under the root and everything recorded, until a listing of the root
/// comes back empty. `settle` is waited first: after a cancelled run, a write whose request
/// was already sent may still be landing. Returns a one-line message naming what is left.
pub async fn remove_all<S: ObjectStore + ?Sized>(
    store: &S,
    written: &Written,
    settle: Duration,
) -> Result<(), String> {
    tokio::time::sleep(settle).await;
    let mut delete_error: Option<String> = None;
    let mut round = 0;
    loop {
        let mut keys: BTreeSet<String> = written.pending().into_iter().collect();
        let list_error = match list_under(store, &written.root).await {
            Ok(listed) => {
                keys.extend(listed);
                None
            }
            Err(e) => Some(e.message),
        };
        keys.retain(|k| k.starts_with(&written.root));
        if keys.is_empty() && list_error.is_none() {
            return Ok(());
        }
        if round == ROUNDS {
            return Err(match list_error {
                Some(e) => format!(
                    "could not list {} to delete the test objects ({e}); delete them by hand",
                    written.url()
                ),
                None => format!(
                    "could not delete {} test objects under {}{}; delete them by hand",
                    keys.len(),
                    written.url(),
                    delete_error.map(|e| format!(" ({e})")).unwrap_or_default()
                ),
            });
        }
        round += 1;
        delete_error = delete(store, written, keys.into_iter().collect())
            .await
            .into_iter()
            .next()
            .map(|(key, e)| format!("{key}: {}", e.message));
        tokio::time::sleep(Duration::from_millis(125 << round)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::{FaultConfig, MemoryStore};
    use crate::store::WriteOptions;
    use bytes::Bytes;

    #[test]
    fn the_prefix_is_unique_dated_and_under_the_users() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        assert_eq!(
            temp_prefix("data/sub/", t, 0xbeef),
            "data/sub/bucketdrive-perfdiag-20270115T080000Z-0000beef/"
        );
        assert_eq!(
            temp_prefix("", t, 1),
            "bucketdrive-perfdiag-20270115T080000Z-00000001/"
        );
        assert_ne!(temp_prefix("", t, 1), temp_prefix("", t, 2));
    }

    #[tokio::test]
    async fn deletes_listed_and_recorded_objects_and_nothing_else() {
        let store = MemoryStore::new();
        let root = "p/bucketdrive-perfdiag-x/";
        let w = Written::new("b", root);
        // Landed, but the answer was lost: only the listing knows it.
        store.insert(&format!("{root}lost-answer"), vec![1u8; 10]);
        // Recorded and landed.
        w.add(&format!("{root}part-00000"));
        store.insert(&format!("{root}part-00000"), vec![2u8; 10]);
        // Recorded, never landed (cancelled before it was sent).
        w.add(&format!("{root}never"));
        // Not ours: a sibling with the same stem, the user's prefix, elsewhere.
        for k in [
            "p/bucketdrive-perfdiag-x",
            "p/bucketdrive-perfdiag-xy/a",
            "p/keep",
            "q",
        ] {
            store.insert(k, vec![3u8; 10]);
        }
        remove_all(&store, &w, Duration::ZERO).await.unwrap();
        assert_eq!(
            store.keys(),
            vec![
                "p/bucketdrive-perfdiag-x",
                "p/bucketdrive-perfdiag-xy/a",
                "p/keep",
                "q"
            ]
        );
        assert_eq!(w.deleted(), 2);
        assert!(w.pending().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn flaky_deletes_are_tried_again_until_the_prefix_is_empty() {
        let store = MemoryStore::new();
        let root = "bucketdrive-perfdiag-y/";
        let w = Written::new("b", root);
        for i in 0..50 {
            let key = format!("{root}o{i}");
            w.add(&key);
            store
                .put(
                    &key,
                    Bytes::from_static(b"x"),
                    Precondition::None,
                    &WriteOptions::default(),
                )
                .await
                .unwrap();
        }
        // Half the requests fail, some after their effect (a lost answer), and the store
        // retries them as GcsStore does: a retried delete that had landed finds nothing.
        store.set_retry(Some(crate::store::retry::RetryPolicy {
            max_attempts: 2,
            ..Default::default()
        }));
        store.set_faults(Some(FaultConfig {
            seed: 7,
            fail_before: 0.3,
            fail_after: 0.2,
            max_delay: Duration::ZERO,
        }));
        let r = remove_all(&store, &w, Duration::ZERO).await;
        store.set_faults(None);
        assert_eq!(r, Ok(()));
        assert!(store.keys().is_empty());
        assert!(w.pending().is_empty());
        // A delete whose answer was lost finds nothing when retried: not counted twice.
        assert!(w.deleted() <= 50, "{}", w.deleted());
    }

    #[tokio::test(start_paused = true)]
    async fn a_bucket_that_refuses_deletes_is_reported_with_what_is_left() {
        let store = MemoryStore::new();
        let root = "bucketdrive-perfdiag-z/";
        let w = Written::new("bkt", root);
        store.insert(&format!("{root}a"), vec![1u8]);
        store.insert(&format!("{root}b"), vec![1u8]);
        store.set_offline(true);
        let err = remove_all(&store, &w, Duration::ZERO).await.unwrap_err();
        assert!(
            err.starts_with("could not list gs://bkt/bucketdrive-perfdiag-z/ to delete"),
            "{err}"
        );
        assert!(err.ends_with("delete them by hand"), "{err}");
        assert_eq!(store.keys().len(), 2, "nothing was deleted offline");
        // Back online, the next try finds and deletes them.
        store.set_offline(false);
        remove_all(&store, &w, Duration::ZERO).await.unwrap();
        assert!(store.keys().is_empty());
    }
}
