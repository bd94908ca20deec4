//! The counting calls at their decision points, driven through the real code over
//! `MemoryStore` with a thread-local recorder: each metric must move by exactly what happened.

use std::sync::Arc;
use std::time::Duration;

use super::testing::{run, Recorded};
use super::*;
use crate::filesystem::OpenMode;
use crate::read::{PrefetchConfig, ReadBudget, Reader};
use crate::store::memory::MemoryStore;
use crate::store::retry::{with_retry, RetryPolicy};
use crate::store::{ObjectStore, StoreError};
use crate::write::writeback::WriteConfig;
use crate::{Filesystem, MountConfig, ROOT_INO};

#[test]
fn every_error_kind_has_its_label() {
    let kinds = [
        StoreErrorKind::NotFound,
        StoreErrorKind::PreconditionFailed,
        StoreErrorKind::Throttled,
        StoreErrorKind::Transient,
        StoreErrorKind::PermissionDenied,
        StoreErrorKind::InvalidArgument,
        StoreErrorKind::Other,
    ];
    let labels: Vec<_> = kinds.into_iter().map(kind_label).collect();
    assert_eq!(labels, ERROR_KINDS);
}

#[test]
fn buckets_ascend() {
    assert!(DURATION_BUCKETS.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn nothing_is_recorded_without_a_recorder() {
    // The calls are safe, and cheap, where no recorder is installed (every other test here).
    read_bytes(1);
    store_request("head", Duration::from_millis(1), None);
    drop(PendingUpload::new());
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn a_reader_counts_hits_misses_fetched_bytes_and_its_budget() {
    let rec = Recorded::default();
    run(&rec, async {
        let store = Arc::new(MemoryStore::new());
        let data = pattern(1_000_000);
        store.insert("obj", data.clone());
        let meta = store.head("obj").await.expect("head");
        let budget = ReadBudget::new(1 << 30);
        let cfg = PrefetchConfig {
            part_size: 64 * 1024,
            concurrency: 4,
            max_concurrency: 4,
            initial_window: 16 * 1024,
            align: 4096,
            slack: 128 * 1024,
        };
        let mut r = Reader::new(store.clone(), &meta, budget.clone(), cfg);
        let (mut off, mut reads) = (0u64, 0u64);
        while off < data.len() as u64 {
            let b = r.read(off, 32 * 1024).await.expect("read");
            assert_eq!(
                rec.gauge(READ_BUDGET_IN_USE),
                budget.in_use() as f64,
                "the gauge follows the budget"
            );
            off += b.len() as u64;
            reads += 1;
        }
        let (hits, misses) = (rec.counter(PREFETCH_HITS), rec.counter(PREFETCH_MISSES));
        assert_eq!(hits + misses, reads, "each read counted once");
        assert!(misses >= 1, "the first read cannot have been foreseen");
        assert!(
            hits > misses,
            "a sequential reader mostly hits: {hits} / {misses}"
        );
        assert_eq!(
            rec.counter(FETCHED_BYTES),
            data.len() as u64,
            "a sequential read downloads each byte once"
        );
        drop(r);
        assert_eq!(rec.gauge(READ_BUDGET_IN_USE), 0.0, "released on close");
        assert_eq!(rec.gauge(READ_BUDGET_LIMIT), (1u64 << 30) as f64);

        // A random read far from the start is a miss; a hop forward inside the block it
        // fetched is a hit.
        let mut r = Reader::new(store.clone(), &meta, budget.clone(), cfg);
        let (h0, m0) = (rec.counter(PREFETCH_HITS), rec.counter(PREFETCH_MISSES));
        r.read(700_000, 100).await.expect("read");
        r.read(700_200, 100).await.expect("read");
        assert_eq!(rec.counter(PREFETCH_MISSES) - m0, 1);
        assert_eq!(rec.counter(PREFETCH_HITS) - h0, 1);
    });
}

#[test]
fn retries_are_counted_by_operation() {
    let rec = Recorded::default();
    run(&rec, async {
        let fast = RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(2),
            max_elapsed: Duration::from_secs(5),
        };
        let r: crate::store::StoreResult<()> = with_retry(fast, "head", "k", || async {
            Err(StoreError::new(StoreErrorKind::Transient, "503"))
        })
        .await;
        assert!(r.is_err());
        // Three attempts: two retries, and the last failure is not one.
        assert_eq!(rec.counter("bucketdrive_store_retries_total{op=head}"), 2);
        let r: crate::store::StoreResult<()> = with_retry(fast, "head", "k", || async {
            Err(StoreError::new(StoreErrorKind::NotFound, "404"))
        })
        .await;
        assert!(r.is_err());
        assert_eq!(
            rec.counter("bucketdrive_store_retries_total{op=head}"),
            2,
            "a permanent error is not retried"
        );
    });
}

#[test]
fn store_requests_count_errors_by_kind_and_time_every_request() {
    let rec = Recorded::default();
    ::metrics::with_local_recorder(&rec, || {
        store_request("put", Duration::from_millis(3), None);
        store_request(
            "put",
            Duration::from_millis(4),
            Some(StoreErrorKind::PreconditionFailed),
        );
    });
    assert_eq!(rec.counter("bucketdrive_store_requests_total{op=put}"), 2);
    assert_eq!(
        rec.counter("bucketdrive_store_errors_total{op=put,kind=precondition_failed}"),
        1
    );
    assert_eq!(
        rec.observed("bucketdrive_store_request_duration_seconds{op=put}"),
        2
    );
}

#[test]
fn a_write_counts_staged_bytes_a_pending_upload_and_its_bytes() {
    let rec = Recorded::default();
    let dir = tempfile::tempdir().expect("tempdir");
    run(&rec, async {
        let store = Arc::new(MemoryStore::new());
        let mut w = WriteConfig::new(dir.path().join("c"));
        // Long enough that the saved version is seen waiting; drain expedites it.
        w.write_back_delay = Duration::from_secs(3600);
        let fs =
            Filesystem::with_write(store.clone(), MountConfig::new("bkt"), w).expect("filesystem");
        let data = pattern(300_000);
        let (attr, h) = fs.create(ROOT_INO, "f").await.expect("create");
        fs.write(h.fh, 0, &data).await.expect("write");
        assert_eq!(
            rec.gauge(STAGED_BYTES),
            data.len() as f64,
            "staged as written"
        );
        fs.flush(h.fh).await.expect("flush");
        assert_eq!(rec.gauge(UPLOADS_PENDING), 1.0, "saved, waiting for upload");
        assert_eq!(rec.counter(UPLOAD_BYTES), 0);
        fs.release(h.fh).await;
        assert_eq!(fs.drain(false).await, 0);
        assert_eq!(store.object_bytes("f").as_deref(), Some(&data[..]));
        assert_eq!(rec.counter(UPLOADS), 1);
        assert_eq!(rec.counter(UPLOAD_BYTES), data.len() as u64);
        assert_eq!(rec.counter(UPLOAD_FAILURES), 0);
        assert_eq!(rec.counter(CONFLICTS), 0);
        // The task ends and the item retires right after the upload is filed.
        for _ in 0..100 {
            if rec.gauge(UPLOADS_PENDING) == 0.0 && rec.gauge(STAGED_BYTES) == 0.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(rec.gauge(UPLOADS_PENDING), 0.0, "nothing left to upload");
        assert_eq!(rec.gauge(STAGED_BYTES), 0.0, "nothing left staged");

        // Reading it back counts the bytes returned.
        let h = fs.open(attr.ino, OpenMode::default()).await.expect("open");
        let b = fs.read(h.fh, 0, 100_000).await.expect("read");
        assert_eq!(rec.counter(READ_BYTES), b.len() as u64);
        fs.release(h.fh).await;
    });
}
