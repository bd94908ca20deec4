//! Deterministic scenarios for the invariants a random run cannot pin down: I5 (offline), I6
//! (backoff while draining) and I7 (two mounts on one bucket).

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use fs_core::filesystem::{Filesystem, TEMP_DIR};
use fs_core::store::memory::{FaultConfig, MemoryStore};
use fs_core::write::upload::UploadMode;
use fs_core::ROOT_INO;
use tokio::runtime::Runtime;

use super::fsview::{read_all, show, show_opt};
use super::{
    describe, drain_bounded, mount_config, runtime, write_config, Fs, Params, STEP_LIMIT, WT,
};

fn scenario_params(delay_ms: u64) -> Params {
    Params {
        delay: Duration::from_millis(delay_ms),
        mode: UploadMode::Composite,
        part_concurrency: 2,
        files_concurrency: 32,
        faults: FaultConfig::delays(0, Duration::ZERO),
        offline_episodes: false,
        commit_interval: Duration::from_secs(1),
        sync_on_close: false,
        passthrough: false,
    }
}

fn block<F: Future>(rt: &Runtime, fut: F) -> F::Output {
    rt.block_on(async {
        tokio::time::timeout(STEP_LIMIT, fut)
            .await
            .expect("a step hung (simulated time)")
    })
}

fn write_new(rt: &Runtime, fs: &Fs, name: &str, data: &[u8]) {
    block(rt, async {
        let (_, h) = fs.create(ROOT_INO, name).await.expect("create");
        fs.write(h.fh, 0, data).await.expect("write");
        fs.flush(h.fh).await.expect("close");
        fs.release(h.fh).await;
    });
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ salt)
        .collect()
}

/// I5: a staged file (written and closed, its upload failing) can be looked up, opened, read,
/// overwritten and closed with the bucket unreachable, without a single request.
#[test]
fn a_staged_file_works_offline() {
    fs_core::platform::set_inline_blocking(true);
    fs_core::store::retry::seed_jitter(Some(5));
    let tmp = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let mut wcfg = write_config(tmp.path().join("cache"), &scenario_params(100));
    // Long retry delays: no upload attempt runs during the calls under test, so every
    // request counted there is theirs.
    wcfg.retry_initial = Duration::from_secs(3600);
    wcfg.retry_max = Duration::from_secs(3600);
    let rt = runtime();
    let fs = {
        let _g = rt.enter();
        Filesystem::with_write(store.clone(), mount_config(), wcfg).unwrap()
    };
    // Written and closed while the link is up; the link dies before its upload runs.
    let v1 = pattern(100_000, 1);
    write_new(&rt, &fs, "notes.txt", &v1);
    store.set_offline(true);
    block(&rt, async {
        tokio::time::sleep(Duration::from_secs(1)).await
    });
    assert!(store.object_bytes("notes.txt").is_none());
    assert_eq!(block(&rt, fs.write_status()).pending_files, 1);

    let mut problems = Vec::new();
    let mut count = store.counts.total();
    let mut step = |what: &str, ok: bool, detail: String| -> bool {
        let now = store.counts.total();
        if now != count {
            problems.push(format!(
                "{what} made {} bucket requests ({detail})",
                now - count
            ));
        } else if !ok {
            problems.push(format!("{what} failed: {detail}"));
        }
        count = now;
        ok
    };
    let v2 = pattern(30_000, 2);
    block(&rt, async {
        let r = fs.lookup(ROOT_INO, "notes.txt").await;
        if !step("lookup", r.is_ok(), format!("{:?}", r.as_ref().err())) {
            return;
        }
        let ino = r.unwrap().ino;
        let got = read_all(&fs, ino).await;
        step(
            "open, read and close for reading",
            got.as_deref().ok() == Some(&v1[..]),
            format!("{:?}", got.as_ref().map(|d| show(d))),
        );
        let r = fs.open(ino, WT).await;
        if !step(
            "open with O_TRUNC",
            r.is_ok(),
            format!("{:?}", r.as_ref().err()),
        ) {
            return;
        }
        let fh = r.unwrap().fh;
        let r = fs.write(fh, 0, &v2).await;
        step("write", r.is_ok(), format!("{r:?}"));
        let r = fs.flush(fh).await;
        step("close (flush)", r.is_ok(), format!("{r:?}"));
        fs.release(fh).await;
        step("release", true, String::new());
        let got = read_all(&fs, ino).await;
        step(
            "read back the new content",
            got.as_deref().ok() == Some(&v2[..]),
            format!("{:?}", got.as_ref().map(|d| show(d))),
        );
    });
    // Once the link is back, the new content goes up.
    store.set_offline(false);
    // The next attempt may wait out the whole retry delay (an hour, set above).
    let left = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(7200), fs.drain(false)).await })
        .unwrap_or(usize::MAX);
    if left != 0 || store.object_bytes("notes.txt").as_deref() != Some(&v2[..]) {
        problems.push(format!(
            "after the link came back: drain left {left}, bucket holds {}",
            show_opt(store.object_bytes("notes.txt").as_deref())
        ));
    }
    drop(rt);
    assert!(
        problems.is_empty(),
        "[{}] violated:\n  {}",
        describe("I5"),
        problems.join("\n  ")
    );
}

/// I6: an upload that keeps failing backs off (retry_initial 10 ms doubling to retry_max
/// 200 ms), even while `drain` waits for it.
#[test]
fn failing_uploads_back_off_while_draining() {
    fs_core::platform::set_inline_blocking(true);
    fs_core::store::retry::seed_jitter(Some(6));
    let tmp = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let rt = runtime();
    let fs = {
        let _g = rt.enter();
        Filesystem::with_write(
            store.clone(),
            mount_config(),
            write_config(tmp.path().join("cache"), &scenario_params(100)),
        )
        .unwrap()
    };
    write_new(&rt, &fs, "f", b"data");
    store.set_offline(true);
    let before = store.counts.write.load(std::sync::atomic::Ordering::SeqCst);
    let window = Duration::from_secs(10);
    let drained = rt.block_on(async { tokio::time::timeout(window, fs.drain(false)).await });
    let attempts = store.counts.write.load(std::sync::atomic::Ordering::SeqCst) - before;
    assert!(drained.is_err(), "drain cannot finish while offline");
    // 20, 40, 80, 160 ms, then every 200 ms: about 55 attempts in 10 s.
    let bound = 80;
    store.set_offline(false);
    let left = rt.block_on(drain_bounded(&fs));
    drop(rt);
    assert!(
        attempts <= bound,
        "[{}] violated: {attempts} upload attempts of one failing file in {window:?} of drain \
         (backoff allows about 55; bound {bound}): drain does not respect the backoff",
        describe("I6")
    );
    assert_eq!(left, Ok(0), "drain finishes once the link is back");
    assert_eq!(&store.object_bytes("f").unwrap()[..], b"data");
}

/// I7: two mounts (two cache directories) upload composite files to one bucket; one crashes
/// mid-upload and restarts. Its clean-up must not delete the other's parts in flight, the
/// other's upload must succeed, and no temporary part may remain once both drain.
#[test]
fn two_mounts_keep_each_others_parts() {
    fs_core::platform::set_inline_blocking(true);
    fs_core::store::retry::seed_jitter(Some(7));
    let tmp = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    store.set_faults(Some(FaultConfig {
        seed: 7,
        fail_before: 0.05,
        fail_after: 0.05,
        max_delay: Duration::from_millis(3),
    }));
    let temps = |store: &MemoryStore| -> BTreeSet<String> {
        store
            .keys()
            .into_iter()
            .filter(|k| k.starts_with(&format!("{TEMP_DIR}/")))
            .collect()
    };
    let mount = |dir: &str, concurrency: usize| {
        let mut p = scenario_params(0);
        p.part_concurrency = concurrency;
        let rt = runtime();
        let fs = {
            let _g = rt.enter();
            Filesystem::with_write(
                store.clone(),
                mount_config(),
                write_config(tmp.path().join(dir), &p),
            )
            .unwrap()
        };
        (rt, fs)
    };
    let mut problems = Vec::new();
    let (rt_a, fs_a) = mount("cache-a", 2);
    let (rt_b, fs_b) = mount("cache-b", 1);
    block(&rt_a, fs_a.start()).unwrap();
    block(&rt_b, fs_b.start()).unwrap();
    let data_a = pattern(150_000, 0xa);
    let data_b = pattern(170_000, 0xb);
    write_new(&rt_a, &fs_a, "from-a.bin", &data_a);
    write_new(&rt_b, &fs_b, "from-b.bin", &data_b);

    // Only B runs: wait until some of its parts are up and its object is not.
    let before_b = temps(&store);
    let mut b_parts = BTreeSet::new();
    for _ in 0..5000 {
        block(&rt_b, async {
            tokio::time::sleep(Duration::from_millis(1)).await
        });
        b_parts = temps(&store).difference(&before_b).cloned().collect();
        if b_parts.len() >= 2 || store.object_bytes("from-b.bin").is_some() {
            break;
        }
    }
    assert!(
        b_parts.len() >= 2 && store.object_bytes("from-b.bin").is_none(),
        "setup: B's upload should be between parts (parts {b_parts:?})"
    );
    // A runs a little, so it is mid-upload too, then crashes and restarts on its cache.
    block(&rt_a, async {
        tokio::time::sleep(Duration::from_millis(4)).await
    });
    drop(rt_a);
    drop(fs_a);
    let (rt_a, fs_a) = mount("cache-a", 2);
    let replayed = block(&rt_a, fs_a.start());
    let gone: Vec<&String> = b_parts
        .iter()
        .filter(|k| store.object_bytes(k).is_none())
        .collect();
    if !gone.is_empty() {
        problems.push(format!(
            "A's restart (start(): replay {replayed:?} and orphan clean-up) deleted {} of B's \
             in-flight parts: {gone:?}",
            gone.len()
        ));
    }
    // Faults stop; both must finish.
    store.set_faults(None);
    for (name, rt, fs) in [("B", &rt_b, &fs_b), ("A", &rt_a, &fs_a)] {
        match rt.block_on(drain_bounded(fs)) {
            Ok(0) => {}
            other => problems.push(format!(
                "[{}] {name}'s drain did not finish with a healthy bucket: {other:?}",
                describe("I6")
            )),
        }
    }
    for (key, want) in [("from-a.bin", &data_a), ("from-b.bin", &data_b)] {
        let got = store.object_bytes(key);
        if got.as_deref() != Some(&want[..]) {
            problems.push(format!(
                "{key} holds {} in the bucket, expected {}",
                show_opt(got.as_deref()),
                show(want)
            ));
        }
    }
    let left = temps(&store);
    if !left.is_empty() {
        problems.push(format!("temporary parts left after both drained: {left:?}"));
    }
    if let Some(k) = store.keys().iter().find(|k| k.contains(".conflict-")) {
        problems.push(format!("[{}] conflict copy {k}", describe("I4")));
    }
    drop(rt_a);
    drop(rt_b);
    assert!(
        problems.is_empty(),
        "[{}] violated:\n  {}",
        describe("I7"),
        problems.join("\n  ")
    );
}
