//! The Windows handle state machine and what real programs do, as scripted call sequences
//! against `MemoryStore`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::config::MountConfig;
use crate::store::memory::MemoryStore;
use crate::store::{MTIME_KEY, MTIME_PRECISE_KEY};
use crate::write::upload::UploadConfig;
use crate::write::writeback::WriteConfig;

const FILE: OpenOptions = OpenOptions {
    directory: false,
    non_directory: true,
    delete_on_close: false,
    create_new: false,
};
const DIR: OpenOptions = OpenOptions {
    directory: true,
    non_directory: false,
    delete_on_close: false,
    create_new: false,
};
const ANY: OpenOptions = OpenOptions {
    directory: false,
    non_directory: false,
    delete_on_close: false,
    create_new: false,
};

struct Fixture {
    store: Arc<MemoryStore>,
    vol: Volume<MemoryStore>,
    _dir: tempfile::TempDir,
}

fn fixture(part_size: u64) -> Fixture {
    fixture_with(part_size, MountConfig::new("bkt"))
}

fn fixture_with(part_size: u64, cfg: MountConfig) -> Fixture {
    let store = Arc::new(MemoryStore::new());
    let dir = tempfile::tempdir().unwrap();
    let mut w = WriteConfig::new(dir.path().join("cache"));
    w.write_back_delay = Duration::from_millis(0);
    w.retry_initial = Duration::from_millis(10);
    w.upload = UploadConfig {
        single_shot_threshold: part_size,
        part_size,
        ..UploadConfig::default()
    };
    let fs = Filesystem::with_write(store.clone(), cfg, w).unwrap();
    Fixture {
        vol: Volume::new(Arc::new(fs), "bkt"),
        store,
        _dir: dir,
    }
}

impl Fixture {
    fn object(&self, key: &str) -> Option<Vec<u8>> {
        self.store.object_bytes(key).map(|b| b.to_vec())
    }

    async fn settle(&self) {
        self.vol.filesystem().drain(false).await;
    }

    /// Everything a program reads through a fresh handle.
    async fn read_all(&self, path: &str) -> Vec<u8> {
        let Opened {
            handle: h, info, ..
        } = self.vol.open(path, FILE).await.unwrap();
        let mut out = Vec::new();
        loop {
            match self.vol.read(&h, out.len() as u64, 1 << 20).await {
                Ok(b) => out.extend_from_slice(&b),
                Err(FsError::EndOfFile) => break,
                Err(e) => panic!("read {path}: {e}"),
            }
        }
        assert_eq!(out.len() as u64, info.file_size);
        self.vol.close(h).await;
        out
    }

    /// Creates `path` with `data` the way `CopyFile` does: create, write, cleanup, close.
    async fn write_new(&self, path: &str, data: &[u8]) {
        let Opened { handle: h, .. } = self.vol.create(path, FILE, 0).await.unwrap();
        self.vol.write(&h, 0, data, false, false).await.unwrap();
        self.vol.cleanup(&h, false).await.unwrap();
        self.vol.close(h).await;
    }

    async fn names(&self, dir: &str) -> Vec<String> {
        let Opened { handle: h, .. } = self.vol.open(dir, DIR).await.unwrap();
        let names = self
            .vol
            .read_directory(&h, None)
            .await
            .unwrap()
            .entries
            .into_iter()
            .map(|e| e.name)
            .collect();
        self.vol.close(h).await;
        names
    }

    fn requests(&self) -> u64 {
        self.store.counts.total()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[tokio::test]
async fn lookups_ignore_case_and_names_keep_theirs() {
    let f = fixture(1 << 20);
    f.store.insert("Docs/Report.docx", "v1");
    assert_eq!(f.read_all(r"\docs\REPORT.DOCX").await, b"v1");
    assert_eq!(f.read_all(r"\Docs\Report.docx").await, b"v1");
    assert_eq!(f.names(r"\").await, vec!["Docs"]);
    assert_eq!(f.names(r"\DOCS").await, vec![".", "..", "Report.docx"]);
    // Creating a name that exists in another case is a collision, as on NTFS.
    assert!(matches!(
        f.vol.create(r"\docs\report.DOCX", FILE, 0).await,
        Err(FsError::Exists)
    ));
    assert!(matches!(
        f.vol.create(r"\DOCS", DIR, 0).await,
        Err(FsError::Exists)
    ));
    // A missing folder on the way is told apart from a missing name.
    assert!(matches!(
        f.vol.open(r"\nope\report.docx", ANY).await,
        Err(FsError::PathNotFound)
    ));
    assert!(matches!(
        f.vol.create(r"\nope\new.txt", FILE, 0).await,
        Err(FsError::PathNotFound)
    ));
    assert!(matches!(
        f.vol.open(r"\docs\report.docx\inside", ANY).await,
        Err(FsError::PathNotFound)
    ));
    assert!(matches!(
        f.vol.open(r"\docs\nope.docx", ANY).await,
        Err(FsError::NotFound)
    ));
    // A directory asked for as a file, and the other way round.
    assert!(matches!(
        f.vol.open(r"\docs", FILE).await,
        Err(FsError::IsDir)
    ));
    assert!(matches!(
        f.vol.open(r"\docs\report.docx", DIR).await,
        Err(FsError::NotDir)
    ));
    // The case a name is created with is the case it keeps.
    f.write_new(r"\docs\MiXeD.txt", b"m").await;
    f.settle().await;
    assert_eq!(f.object("Docs/MiXeD.txt").as_deref(), Some(&b"m"[..]));
    let entry = {
        let Opened { handle: h, .. } = f.vol.open(r"\docs", DIR).await.unwrap();
        let e = f.vol.dir_info_by_name(&h, "mixed.TXT").await.unwrap();
        f.vol.close(h).await;
        e
    };
    assert_eq!(entry.name, "MiXeD.txt");
    assert_eq!(entry.info.file_size, 1);
}

#[tokio::test]
async fn names_differing_only_by_case_each_open_their_own_object() {
    let f = fixture(1 << 20);
    f.store.insert("d/a.txt", "lower");
    f.store.insert("d/A.txt", "upper");
    // Sorted as Windows sorts, ignoring case: "A (CASE 2).TXT" < "A.TXT".
    assert_eq!(
        f.names(r"\d").await,
        vec![".", "..", "a (case 2).txt", "A.txt"]
    );
    assert_eq!(f.read_all(r"\d\A.txt").await, b"upper");
    assert_eq!(f.read_all(r"\d\a (case 2).txt").await, b"lower");
    // An exact object name still reaches that object.
    assert_eq!(f.read_all(r"\d\a.txt").await, b"lower");
    // Any other case reaches the one that kept its name.
    assert_eq!(f.read_all(r"\d\A.TXT").await, b"upper");
}

#[tokio::test]
async fn names_windows_forbids_are_shown_mapped_and_created_back() {
    let f = fixture(1 << 20);
    f.store.insert("what?.txt", "q");
    f.store.insert("CON", "device");
    let names = f.names(r"\").await;
    assert_eq!(names, vec!["what\u{FF1F}.txt", "\u{FF23}ON"]);
    assert_eq!(f.read_all("\\what\u{FF1F}.txt").await, b"q");
    assert_eq!(f.read_all("\\\u{FF23}ON").await, b"device");
    f.write_new("\\a\u{FF1A}b", b"colon").await;
    f.settle().await;
    assert_eq!(f.object("a:b").as_deref(), Some(&b"colon"[..]));
}

#[tokio::test]
async fn names_over_the_windows_limits_are_skipped() {
    let f = fixture(1 << 20);
    let long_name = "n".repeat(MAX_NAME_UNITS + 1);
    f.store.insert(&format!("d/{long_name}"), "x");
    // A path within the bucket's 1,024 bytes can pass 1,024 UTF-16 units once a case
    // collision adds its suffix.
    let deep = vec!["d".repeat(250); 4].join("/");
    let (shown, collided) = ("F".repeat(18), "f".repeat(18));
    f.store.insert(&format!("{deep}/{shown}"), "y");
    f.store.insert(&format!("{deep}/{collided}"), "y");
    f.store.insert("d/ok", "z");
    assert_eq!(f.names(r"\d").await, vec![".", "..", "ok"]);
    let deep_win = format!("\\{}", deep.replace('/', "\\"));
    assert_eq!(f.names(&deep_win).await, vec![".", "..", shown.as_str()]);
    assert!(matches!(
        f.vol
            .open(&format!("{deep_win}\\{collided} (case 2)"), FILE)
            .await,
        Err(FsError::InvalidName(_))
    ));
}

#[tokio::test]
async fn delete_on_close_through_set_delete_and_cleanup() {
    let f = fixture(1 << 20);
    f.store.insert("old.txt", "old");
    f.store.insert("full/x", "x");
    // An existing file: marked, then deleted at cleanup.
    let Opened { handle: h, .. } = f.vol.open(r"\OLD.txt", FILE).await.unwrap();
    f.vol.set_delete(&h, true).await.unwrap();
    assert!(
        f.object("old.txt").is_some(),
        "nothing is deleted before cleanup"
    );
    f.vol.cleanup(&h, true).await.unwrap();
    f.vol.close(h).await;
    assert!(f.object("old.txt").is_none());
    assert!(matches!(
        f.vol.open(r"\old.txt", ANY).await,
        Err(FsError::NotFound)
    ));

    // A new temporary file deleted on close never reaches the bucket.
    let Opened { handle: h, .. } = f.vol.create(r"\~tmp", FILE, 0).await.unwrap();
    f.vol.write(&h, 0, b"scratch", false, false).await.unwrap();
    f.vol.set_delete(&h, true).await.unwrap();
    f.vol.cleanup(&h, true).await.unwrap();
    f.vol.close(h).await;
    f.settle().await;
    assert!(f.object("~tmp").is_none());

    // A directory with something in it refuses; an empty one goes.
    let Opened { handle: h, .. } = f.vol.open(r"\full", DIR).await.unwrap();
    assert!(matches!(
        f.vol.set_delete(&h, true).await,
        Err(FsError::NotEmpty)
    ));
    f.vol.close(h).await;
    let Opened { handle: h, .. } = f.vol.create(r"\empty", DIR, 0).await.unwrap();
    f.vol.set_delete(&h, true).await.unwrap();
    f.vol.cleanup(&h, true).await.unwrap();
    f.vol.close(h).await;
    assert!(f.object("empty/").is_none());
    assert!(!f.names(r"\").await.contains(&"empty".to_string()));
    // A cleanup without the flag deletes nothing (another handle cleared it).
    let Opened { handle: h, .. } = f.vol.open(r"\full\x", FILE).await.unwrap();
    f.vol.set_delete(&h, true).await.unwrap();
    f.vol.set_delete(&h, false).await.unwrap();
    f.vol.cleanup(&h, false).await.unwrap();
    f.vol.close(h).await;
    assert!(f.object("full/x").is_some());
}

#[tokio::test]
async fn rename_with_and_without_replace() {
    let f = fixture(1 << 20);
    f.store.insert("a.txt", "A");
    f.store.insert("b.txt", "B");
    f.store.insert("dir/x", "x");

    let Opened { handle: h, .. } = f.vol.open(r"\a.txt", FILE).await.unwrap();
    assert!(matches!(
        f.vol.rename(&h, r"\B.TXT", false).await,
        Err(FsError::Exists)
    ));
    assert!(matches!(
        f.vol.rename(&h, r"\dir", true).await,
        Err(FsError::PermissionDenied(_))
    ));
    // The target is open for reading while it is replaced.
    let Opened { handle: target, .. } = f.vol.open(r"\b.txt", FILE).await.unwrap();
    assert_eq!(&f.vol.read(&target, 0, 10).await.unwrap()[..], b"B");
    f.vol.rename(&h, r"\B.TXT", true).await.unwrap();
    f.vol.cleanup(&h, false).await.unwrap();
    f.vol.close(h).await;
    f.vol.cleanup(&target, false).await.unwrap();
    f.vol.close(target).await;
    f.settle().await;
    assert!(f.object("a.txt").is_none());
    assert_eq!(
        f.object("b.txt").as_deref(),
        Some(&b"A"[..]),
        "replaced under its existing name"
    );
    assert!(f.object("B.TXT").is_none());

    // Only the case changes.
    let Opened { handle: h, .. } = f.vol.open(r"\b.txt", FILE).await.unwrap();
    f.vol.rename(&h, r"\Bee.txt", false).await.unwrap();
    f.vol.close(h).await;
    let Opened { handle: h, .. } = f.vol.open(r"\bee.txt", FILE).await.unwrap();
    f.vol.rename(&h, r"\BEE.txt", false).await.unwrap();
    f.vol.close(h).await;
    assert_eq!(f.object("BEE.txt").as_deref(), Some(&b"A"[..]));
    assert!(f.object("Bee.txt").is_none());

    // The source is open with unsaved writes: the data follows the new name.
    let Opened { handle: h, .. } = f.vol.create(r"\draft", FILE, 0).await.unwrap();
    f.vol.write(&h, 0, b"draft", false, false).await.unwrap();
    f.vol.rename(&h, r"\dir\final", false).await.unwrap();
    f.vol.write(&h, 5, b"+more", false, false).await.unwrap();
    f.vol.cleanup(&h, false).await.unwrap();
    f.vol.close(h).await;
    f.settle().await;
    assert!(f.object("draft").is_none());
    assert_eq!(f.object("dir/final").as_deref(), Some(&b"draft+more"[..]));

    // A directory moves with what is in it.
    let Opened { handle: h, .. } = f.vol.open(r"\DIR", DIR).await.unwrap();
    f.vol.rename(&h, r"\moved", false).await.unwrap();
    f.vol.close(h).await;
    assert_eq!(f.read_all(r"\moved\x").await, b"x");
    assert_eq!(f.read_all(r"\moved\final").await, b"draft+more");
}

#[tokio::test]
async fn overwrite_and_supersede_start_the_file_empty() {
    let f = fixture(1 << 20);
    f.store.insert("f.bin", pattern(5000, 1));
    let Opened {
        handle: h, info, ..
    } = f.vol.open(r"\f.bin", FILE).await.unwrap();
    assert_eq!(info.file_size, 5000);
    let info = f.vol.overwrite(&h, 0).await.unwrap();
    assert_eq!(info.file_size, 0);
    assert!(matches!(
        f.vol.read(&h, 0, 10).await,
        Err(FsError::EndOfFile)
    ));
    f.vol.write(&h, 0, b"new", false, false).await.unwrap();
    f.vol.cleanup(&h, false).await.unwrap();
    f.vol.close(h).await;
    f.settle().await;
    assert_eq!(f.object("f.bin").as_deref(), Some(&b"new"[..]));
    // A directory cannot be overwritten.
    f.store.insert("d/", "");
    let Opened { handle: h, .. } = f.vol.open(r"\d", ANY).await.unwrap();
    assert!(matches!(f.vol.overwrite(&h, 0).await, Err(FsError::IsDir)));
    f.vol.close(h).await;
}

#[tokio::test]
async fn file_size_and_allocation_before_out_of_order_writes() {
    let f = fixture(1 << 20);
    let data = pattern(300_000, 7);
    let Opened { handle: h, .. } = f.vol.create(r"\big.bin", FILE, 0).await.unwrap();
    let info = f.vol.set_file_size(&h, 1 << 20, true).await.unwrap();
    assert_eq!((info.file_size, info.allocation_size), (0, 1 << 20));
    let info = f
        .vol
        .set_file_size(&h, data.len() as u64, false)
        .await
        .unwrap();
    assert_eq!(info.file_size, data.len() as u64);
    // Last chunk first, then the rest backwards.
    let chunks: Vec<_> = data.chunks(64 * 1024).enumerate().collect();
    for (i, chunk) in chunks.iter().rev() {
        let (n, _) = f
            .vol
            .write(&h, (*i * 64 * 1024) as u64, chunk, false, false)
            .await
            .unwrap();
        assert_eq!(n as usize, chunk.len());
    }
    // Paging I/O past the end never extends the file.
    let (n, info) = f
        .vol
        .write(&h, data.len() as u64, b"xx", false, true)
        .await
        .unwrap();
    assert_eq!((n, info.file_size), (0, data.len() as u64));
    // Append.
    let (_, info) = f.vol.write(&h, 0, b"tail", true, false).await.unwrap();
    assert_eq!(info.file_size, data.len() as u64 + 4);
    // An allocation below the size cuts the file, as on NTFS.
    let info = f
        .vol
        .set_file_size(&h, data.len() as u64, true)
        .await
        .unwrap();
    assert_eq!(info.file_size, data.len() as u64);
    f.vol.cleanup(&h, false).await.unwrap();
    f.vol.close(h).await;
    f.settle().await;
    assert_eq!(f.object("big.bin"), Some(data));
}

/// Office flushes on every save. The flush makes the bytes durable on the local disk and
/// returns, even with the network down; the upload follows when it is back.
#[tokio::test]
async fn flush_is_local_durability_and_does_not_wait_for_the_bucket() {
    let f = fixture(1 << 20);
    let Opened { handle: h, .. } = f.vol.create(r"\log.txt", FILE, 0).await.unwrap();
    f.store.set_offline(true);
    f.vol.write(&h, 0, b"line 1\n", false, false).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), f.vol.flush(&h))
        .await
        .expect("a flush does not wait for the bucket")
        .expect("a flush succeeds while the bucket is unreachable");
    f.vol.write(&h, 7, b"line 2\n", false, false).await.unwrap();
    f.vol.flush(&h).await.unwrap();
    f.vol.cleanup(&h, false).await.unwrap();
    f.vol.close(h).await;
    assert!(f.object("log.txt").is_none());
    f.store.set_offline(false);
    f.settle().await;
    assert_eq!(
        f.object("log.txt").as_deref(),
        Some(&b"line 1\nline 2\n"[..])
    );
}

/// Explorer copying files into a folder: each create looks its name up (a miss) and creates
/// it. The folder's kept listing is edited in place, so listing costs do not grow with the
/// folder: the names listed for the second hundred files are no more than for the first.
#[tokio::test]
async fn creating_many_files_in_a_folder_does_not_list_it_again_and_again() {
    // The caches' TTLs run on the real clock: long enough to outlast 200 creates on a loaded
    // machine (under Wine, the 5 s default was not).
    let mut cfg = MountConfig::new("bkt");
    cfg.stat_ttl = Duration::from_secs(600);
    cfg.negative_ttl = Duration::from_secs(600);
    let f = fixture_with(1 << 20, cfg);
    f.store.insert("dst/existing.txt", "x");
    let listed = || f.store.counts.listed.load(Ordering::SeqCst);
    let lists = || f.store.counts.list.load(Ordering::SeqCst);
    let heads = || f.store.counts.head.load(Ordering::SeqCst);
    let mut cost = Vec::new();
    for batch in 0..2 {
        let (names0, lists0, heads0) = (listed(), lists(), heads());
        for i in 0..100 {
            let path = format!(r"\Dst\File {}.txt", batch * 100 + i);
            let Opened { handle: h, .. } = f.vol.create(&path, FILE, 0).await.unwrap();
            f.vol
                .write(&h, 0, path.as_bytes(), false, false)
                .await
                .unwrap();
            // Explorer reads the new entry back by name.
            let Opened { handle: dir, .. } = f.vol.open(r"\dst", DIR).await.unwrap();
            let e = f
                .vol
                .dir_info_by_name(&dir, &path[5..].to_uppercase())
                .await
                .unwrap();
            assert_eq!(e.name, path[5..]);
            f.vol.close(dir).await;
            f.vol.cleanup(&h, false).await.unwrap();
            f.vol.close(h).await;
        }
        cost.push((listed() - names0, lists() - lists0, heads() - heads0));
    }
    let (first, second) = (cost[0], cost[1]);
    eprintln!(
        "100 creates each: names listed {} then {}, LIST requests {} then {}, HEAD requests {} then {}",
        first.0, second.0, first.1, second.1, first.2, second.2
    );
    assert!(
        second.0 <= first.0 + 2,
        "names listed grew with the folder: {first:?} then {second:?}"
    );
    assert!(
        second.1 <= 100,
        "more than one LIST request per created file: {second:?}"
    );
    // WinFsp holds its volume-wide lock through each create: with the folder listed once,
    // creating a name asks the bucket nothing (the uploads come later, outside the lock).
    assert_eq!(
        (second.1, second.2),
        (0, 0),
        "lookups of new names went to the bucket: {second:?}"
    );
    // Nothing was lost from the view: a new enumeration shows all 201 names, and `.`, `..`.
    assert_eq!(f.names(r"\dst").await.len(), 203);
    f.settle().await;
    assert_eq!(
        f.object("dst/File 150.txt").as_deref(),
        Some(&br"\Dst\File 150.txt"[..])
    );
}

/// WinFsp keeps the name open and create return as the file's name; a case-insensitive volume
/// that returns none keeps the caller's spelling, upper-cased.
#[tokio::test]
async fn open_and_create_return_the_name_as_the_folder_shows_it() {
    let f = fixture(1 << 20);
    f.store.insert("Docs/Budget.xlsx", "b");
    f.store.insert("Docs/a:b.txt", "m");
    let o = f.vol.open(r"\DOCS\BUDGET.XLSX", FILE).await.unwrap();
    assert_eq!(o.name, r"\Docs\Budget.xlsx");
    f.vol.close(o.handle).await;
    let o = f.vol.open(r"\docs", DIR).await.unwrap();
    assert_eq!(o.name, r"\Docs");
    f.vol.close(o.handle).await;
    let o = f.vol.open(r"\", DIR).await.unwrap();
    assert_eq!(o.name, r"\");
    f.vol.close(o.handle).await;
    let o = f.vol.open("\\docs\\A\u{FF1A}B.TXT", FILE).await.unwrap();
    assert_eq!(
        o.name, "\\Docs\\a\u{FF1A}b.txt",
        "the mapped name, in its own case"
    );
    f.vol.close(o.handle).await;
    // A new file keeps the case it is created with, under the folder's real name.
    let o = f
        .vol
        .create(r"\DOCS\New Sheet.xlsx", FILE, 0)
        .await
        .unwrap();
    assert_eq!(o.name, r"\Docs\New Sheet.xlsx");
    f.vol.cleanup(&o.handle, false).await.unwrap();
    f.vol.close(o.handle).await;
    let o = f.vol.create(r"\NewDir", DIR, 0).await.unwrap();
    assert_eq!(o.name, r"\NewDir");
    f.vol.close(o.handle).await;
    // Two objects that differ only by case: each opens under the name the listing shows.
    f.store.insert("Docs/Report.txt", "R");
    f.store.insert("Docs/report.txt", "r");
    assert!(f
        .names(r"\docs")
        .await
        .contains(&"report (case 2).txt".to_string()));
    let o = f
        .vol
        .open(r"\docs\REPORT (CASE 2).TXT", FILE)
        .await
        .unwrap();
    assert_eq!(o.name, r"\Docs\report (case 2).txt");
    f.vol.close(o.handle).await;
    // Its exact object name also opens it; WinFsp takes only a name that differs from the
    // one asked for by case, so that is the name it keeps.
    let o = f.vol.open(r"\docs\report.txt", FILE).await.unwrap();
    assert_eq!(o.name, r"\Docs\report.txt");
    f.vol.close(o.handle).await;
    // The case-only rename WinFsp would have skipped: the open name was the old case.
    let o = f.vol.open(r"\DOCS\BUDGET.XLSX", FILE).await.unwrap();
    f.vol
        .rename(&o.handle, r"\Docs\BUDGET.XLSX", false)
        .await
        .unwrap();
    f.vol.close(o.handle).await;
    let o = f.vol.open(r"\docs\budget.xlsx", FILE).await.unwrap();
    assert_eq!(o.name, r"\Docs\BUDGET.XLSX");
    f.vol.close(o.handle).await;
    f.settle().await;
    assert_eq!(f.object("Docs/BUDGET.XLSX").as_deref(), Some(&b"b"[..]));
    assert!(f.object("Docs/Budget.xlsx").is_none());
}

/// A folder opened with `FILE_DELETE_ON_CLOSE`: WinFsp marks it for deletion at cleanup without
/// asking first. One with something in it is refused at open, as FAT and NTFS refuse it, and
/// if something appears in an empty one before cleanup, cleanup leaves it.
#[tokio::test]
async fn delete_on_close_of_a_folder_that_is_not_empty() {
    let f = fixture(1 << 20);
    f.store.insert("full/x", "x");
    let doc = OpenOptions {
        delete_on_close: true,
        ..DIR
    };
    assert!(matches!(
        f.vol.open(r"\FULL", doc).await,
        Err(FsError::NotEmpty)
    ));
    // Cleanup with the delete flag (no set_delete before it) keeps a folder that has children.
    let o = f.vol.open(r"\full", DIR).await.unwrap();
    assert!(matches!(
        f.vol.cleanup(&o.handle, true).await,
        Err(FsError::NotEmpty)
    ));
    f.vol.close(o.handle).await;
    assert_eq!(f.object("full/x").as_deref(), Some(&b"x"[..]));
    assert_eq!(f.names(r"\").await, vec!["full"]);
    // An empty folder opened delete-on-close goes at cleanup; one that got a file does not.
    let o = f.vol.create(r"\gone", DIR, 0).await.unwrap();
    f.vol.close(o.handle).await;
    let o = f.vol.open(r"\gone", doc).await.unwrap();
    f.vol.cleanup(&o.handle, true).await.unwrap();
    f.vol.close(o.handle).await;
    let o = f.vol.create(r"\kept", DIR, 0).await.unwrap();
    f.vol.close(o.handle).await;
    let o = f.vol.open(r"\kept", doc).await.unwrap();
    f.write_new(r"\kept\late.txt", b"late").await;
    assert!(matches!(
        f.vol.cleanup(&o.handle, true).await,
        Err(FsError::NotEmpty)
    ));
    f.vol.close(o.handle).await;
    let mut names = f.names(r"\").await;
    names.sort();
    assert_eq!(names, vec!["full", "kept"]);
    f.settle().await;
    assert_eq!(f.object("kept/late.txt").as_deref(), Some(&b"late"[..]));
}

/// One folding everywhere: the lookup and the uniqueness of names agree, with Windows' upcase
/// (one unit to one unit), so `straße.txt` and `STRASSE.txt` are two files, as on NTFS.
#[tokio::test]
async fn case_folding_is_the_same_for_lookups_and_for_uniqueness() {
    let f = fixture(1 << 20);
    f.store.insert("straße.txt", "sz");
    f.store.insert("STRASSE.txt", "ss");
    f.store.insert("ΟΔΟΣ", "greek");
    let mut names = f.names(r"\").await;
    names.sort();
    assert_eq!(
        names,
        vec!["STRASSE.txt", "straße.txt", "ΟΔΟΣ"],
        "no suffix: no collision"
    );
    assert_eq!(f.read_all(r"\STRAßE.TXT").await, b"sz");
    assert_eq!(f.read_all(r"\strasse.txt").await, b"ss");
    // Creating the other spelling of an existing name is a collision in both.
    assert!(matches!(
        f.vol.create(r"\Straße.TXT", FILE, 0).await,
        Err(FsError::Exists)
    ));
    // Greek final sigma folds like sigma.
    assert_eq!(f.read_all(r"\οδος").await, b"greek");
    assert_eq!(f.read_all(r"\οδοσ").await, b"greek");
}

#[tokio::test]
async fn set_basic_info_stores_the_last_write_time_as_mtime() {
    let f = fixture(1 << 20);
    f.store.insert("photo.jpg", "jpeg");
    // With a fraction of a second, as robocopy sets it (FILETIME counts 100 ns).
    let t = SystemTime::UNIX_EPOCH + Duration::new(1_500_000_000, 123_456_700);
    let Opened { handle: h, .. } = f.vol.open(r"\photo.jpg", FILE).await.unwrap();
    let writes = f.store.counts.write.load(Ordering::SeqCst);
    let info = f.vol.set_basic_info(&h, to_filetime(t)).await.unwrap();
    assert_eq!(info.last_write_time, to_filetime(t));
    // 0 leaves the time alone.
    let info = f.vol.set_basic_info(&h, 0).await.unwrap();
    assert_eq!(info.last_write_time, to_filetime(t));
    f.vol.cleanup(&h, false).await.unwrap();
    f.vol.close(h).await;
    f.settle().await;
    let meta = f.store.head("photo.jpg").await.unwrap();
    assert_eq!(
        meta.metadata.get(MTIME_KEY).map(String::as_str),
        Some("1500000000")
    );
    assert_eq!(
        meta.metadata.get(MTIME_PRECISE_KEY).map(String::as_str),
        Some("2017-07-14T02:40:00.123456700Z")
    );
    assert_eq!(meta.mtime(), t);
    assert_eq!(f.object("photo.jpg").as_deref(), Some(&b"jpeg"[..]));
    assert_eq!(
        f.store.counts.write.load(Ordering::SeqCst) - writes,
        1,
        "one metadata patch, no re-upload"
    );
    // robocopy's second run: the same time again changes nothing; a time that differs only
    // below a second is stored, not taken for the same one.
    let writes = f.store.counts.write.load(Ordering::SeqCst);
    let Opened {
        handle: h, info, ..
    } = f.vol.open(r"\PHOTO.JPG", FILE).await.unwrap();
    assert_eq!(info.last_write_time, to_filetime(t));
    f.vol.set_basic_info(&h, to_filetime(t)).await.unwrap();
    let t2 = SystemTime::UNIX_EPOCH + Duration::new(1_500_000_000, 900_000_000);
    let info = f.vol.set_basic_info(&h, to_filetime(t2)).await.unwrap();
    assert_eq!(info.last_write_time, to_filetime(t2));
    f.vol.cleanup(&h, false).await.unwrap();
    f.vol.close(h).await;
    f.settle().await;
    let meta = f.store.head("photo.jpg").await.unwrap();
    assert_eq!(meta.mtime(), t2);
    assert_eq!(f.store.counts.write.load(Ordering::SeqCst) - writes, 1);
}

/// Every name of a directory through the adapter's loop: pages after the last name until the
/// end, as WinFsp asks when the caller's buffer has room.
async fn enumerate(vol: &Volume<MemoryStore>, h: &WinHandle) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    loop {
        let page = vol
            .read_directory(h, names.last().map(String::as_str))
            .await
            .unwrap();
        assert!(page.entries.len() <= DIR_PAGE, "a page is bounded");
        names.extend(page.entries.into_iter().map(|e| e.name));
        if page.end {
            return names;
        }
    }
}

#[tokio::test]
async fn enumeration_pages_with_a_marker_and_returns_every_name() {
    let f = fixture(1 << 20);
    // Names a pre-filter of our own got wrong: WinFsp matches `*.TXT`, `>`, `<` and `"` with
    // Windows' rules, so the volume returns everything.
    for n in ["b.txt", "A.md", "c.txt", "D.txt", "noext", "a.b.c", "ß.txt"] {
        f.store.insert(&format!("d/{n}"), "x");
    }
    let Opened { handle: h, .. } = f.vol.open(r"\d", DIR).await.unwrap();
    let all = enumerate(&f.vol, &h).await;
    assert_eq!(
        all,
        vec![".", "..", "a.b.c", "A.md", "b.txt", "c.txt", "D.txt", "noext", "ß.txt"]
    );
    let after = f.vol.read_directory(&h, Some("b.txt")).await.unwrap();
    let after: Vec<_> = after.entries.into_iter().map(|e| e.name).collect();
    assert_eq!(after, vec!["c.txt", "D.txt", "noext", "ß.txt"]);
    // A marker in another case, or one that is no longer there, still finds its place.
    let after = f.vol.read_directory(&h, Some("C.TXT")).await.unwrap();
    assert_eq!(after.entries[0].name, "D.txt");
    let after = f.vol.read_directory(&h, Some("bz")).await.unwrap();
    assert_eq!(after.entries[0].name, "c.txt");
    f.vol.close(h).await;
}

#[tokio::test]
async fn a_big_folder_comes_in_bounded_pages_from_one_listing() {
    let f = fixture(1 << 20);
    let n = DIR_PAGE * 5 + 7;
    for i in 0..n {
        f.store.insert(&format!("big/f{i:05}"), "x");
    }
    let Opened { handle: h, .. } = f.vol.open(r"\big", DIR).await.unwrap();
    let lists = f.store.counts.list.load(Ordering::SeqCst);
    let names = enumerate(&f.vol, &h).await;
    assert_eq!(names.len(), n + 2);
    let want: Vec<String> = (0..n).map(|i| format!("f{i:05}")).collect();
    assert_eq!(&names[2..], &want[..]);
    assert_eq!(
        f.store.counts.list.load(Ordering::SeqCst) - lists,
        (n as u64).div_ceil(1000),
        "one listing for the whole enumeration"
    );
    f.vol.close(h).await;
}

/// Explorer copying a 100 MiB file in: create with an allocation size, set the size, write
/// chunks out of order, set the times, close.
#[tokio::test]
async fn scenario_explorer_copies_a_100_mib_file_in() {
    let f = fixture(16 << 20);
    const SIZE: usize = 100 << 20;
    const CHUNK: usize = 1 << 20;
    let data = pattern(SIZE, 3);
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let Opened { handle: h, .. } = f.vol.create(r"\clip.mp4", FILE, SIZE as u64).await.unwrap();
    f.vol.set_file_size(&h, SIZE as u64, true).await.unwrap();
    f.vol.set_file_size(&h, SIZE as u64, false).await.unwrap();
    // Overlapped I/O: two writes of one handle in flight at once, from both ends inwards.
    let n = SIZE / CHUNK;
    for i in 0..n / 2 {
        let (hi, lo) = ((n - 1 - i) * CHUNK, i * CHUNK);
        let (a, b) = tokio::join!(
            f.vol
                .write(&h, hi as u64, &data[hi..hi + CHUNK], false, false),
            f.vol
                .write(&h, lo as u64, &data[lo..lo + CHUNK], false, false),
        );
        assert_eq!((a.unwrap().0, b.unwrap().0), (CHUNK as u32, CHUNK as u32));
    }
    let info = f.vol.set_basic_info(&h, to_filetime(t)).await.unwrap();
    assert_eq!(info.file_size, SIZE as u64);
    f.vol.cleanup(&h, false).await.unwrap();
    f.vol.close(h).await;
    f.settle().await;
    let got = f.object("clip.mp4").expect("uploaded");
    assert!(got == data, "object bytes differ from what was written");
    let meta = f.store.head("clip.mp4").await.unwrap();
    assert_eq!(
        meta.metadata.get(MTIME_KEY).map(String::as_str),
        Some("1700000000")
    );
}

/// Office's safe save: write a temporary file, rename the original to a backup, rename the
/// temporary to the original, delete the backup. One object with the new bytes remains.
#[tokio::test]
async fn scenario_office_safe_save() {
    let f = fixture(1 << 20);
    f.store.insert("Docs/Budget.xlsx", "version 1");
    // Excel has the document open while it saves.
    let Opened { handle: doc, .. } = f.vol.open(r"\Docs\Budget.xlsx", FILE).await.unwrap();
    assert_eq!(&f.vol.read(&doc, 0, 100).await.unwrap()[..], b"version 1");
    // 1. The new content goes to a temporary file.
    f.write_new(r"\Docs\~$tmp1234.tmp", b"version 2, longer")
        .await;
    // 2. The original becomes the backup (through the open handle).
    f.vol
        .rename(&doc, r"\Docs\Budget.xlsx~RF1.TMP", false)
        .await
        .unwrap();
    // 3. The temporary becomes the original.
    let Opened { handle: tmp, .. } = f.vol.open(r"\Docs\~$tmp1234.tmp", FILE).await.unwrap();
    f.vol
        .rename(&tmp, r"\Docs\Budget.xlsx", true)
        .await
        .unwrap();
    f.vol.cleanup(&tmp, false).await.unwrap();
    f.vol.close(tmp).await;
    // 4. The backup is deleted.
    f.vol.set_delete(&doc, true).await.unwrap();
    f.vol.cleanup(&doc, true).await.unwrap();
    f.vol.close(doc).await;
    f.settle().await;
    // 5. One object, with the new bytes.
    assert_eq!(f.store.keys(), vec!["Docs/Budget.xlsx".to_string()]);
    assert_eq!(
        f.object("Docs/Budget.xlsx").as_deref(),
        Some(&b"version 2, longer"[..])
    );
    assert_eq!(f.read_all(r"\docs\budget.xlsx").await, b"version 2, longer");
}

/// Explorer asks for `desktop.ini` and `Thumbs.db` in every folder it shows, again and
/// again. After the first miss, the answer comes from the caches.
#[tokio::test]
async fn scenario_desktop_ini_probes_are_answered_from_the_negative_cache() {
    let f = fixture(1 << 20);
    f.store.insert("Photos/a.jpg", "a");
    f.store.insert("b.txt", "b");
    for dir in [r"", r"\Photos"] {
        for probe in ["desktop.ini", "Thumbs.db"] {
            let path = format!(r"{dir}\{probe}");
            assert!(matches!(
                f.vol.attributes_of(&path).await,
                Err(FsError::NotFound)
            ));
            let after_first = f.requests();
            for _ in 0..20 {
                assert!(matches!(
                    f.vol.attributes_of(&path).await,
                    Err(FsError::NotFound)
                ));
                assert!(matches!(
                    f.vol.open(&path.to_uppercase(), ANY).await,
                    Err(FsError::NotFound)
                ));
            }
            assert_eq!(
                f.requests(),
                after_first,
                "{path}: repeated lookups went to the bucket"
            );
        }
    }
    // Files that exist are still found.
    assert_eq!(f.read_all(r"\photos\A.JPG").await, b"a");
}

#[tokio::test]
async fn volume_reports_free_space_and_the_bucket_as_label() {
    let f = fixture(1 << 20);
    let st = f.vol.volume_stats();
    assert_eq!(st.label, "bkt");
    assert!(st.free_size > 0 && st.total_size >= st.free_size);
}

mod model {
    //! The Windows reference model: random programs' calls (create, overwrite, write at an
    //! offset, rename with and without replace, delete on close, case-only renames) through the
    //! volume, under names that differ only by case, and the same calls on a map keyed
    //! case-insensitively that remembers each file's case. Every answer must agree, and once
    //! uploads drain the bucket must hold exactly the model.

    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// Names that collide in every case combination: three files, spelled six ways.
    const NAMES: [&str; 6] = ["a.txt", "A.TXT", "b.txt", "B.txt", "c", "C"];

    #[derive(Debug, Clone)]
    enum Op {
        Create {
            name: usize,
            len: u16,
            byte: u8,
        },
        Overwrite {
            name: usize,
            len: u16,
            byte: u8,
        },
        WriteAt {
            name: usize,
            offset: u16,
            len: u16,
            byte: u8,
        },
        Rename {
            from: usize,
            to: usize,
            replace: bool,
        },
        Delete {
            name: usize,
        },
        Read {
            name: usize,
        },
        Settle,
    }

    fn op() -> impl Strategy<Value = Op> {
        let n = 0..NAMES.len();
        prop_oneof![
            3 => (n.clone(), 0u16..2000, any::<u8>()).prop_map(|(name, len, byte)| Op::Create { name, len, byte }),
            2 => (n.clone(), 0u16..2000, any::<u8>()).prop_map(|(name, len, byte)| Op::Overwrite { name, len, byte }),
            2 => (n.clone(), 0u16..3000, 1u16..1000, any::<u8>()).prop_map(|(name, offset, len, byte)| Op::WriteAt { name, offset, len, byte }),
            3 => (n.clone(), n.clone(), any::<bool>()).prop_map(|(from, to, replace)| Op::Rename { from, to, replace }),
            1 => n.clone().prop_map(|name| Op::Delete { name }),
            2 => n.prop_map(|name| Op::Read { name }),
            1 => Just(Op::Settle),
        ]
    }

    /// Upper-cased name → (the name as kept, the bytes).
    type Model = BTreeMap<String, (String, Vec<u8>)>;

    fn key(name: &str) -> String {
        name.to_uppercase()
    }

    fn path(name: &str) -> String {
        format!(r"\{name}")
    }

    /// What an error is, for comparing with the model's expectation.
    fn kind(r: &FsResult<()>) -> &'static str {
        match r {
            Ok(()) => "ok",
            Err(FsError::NotFound) => "not found",
            Err(FsError::Exists) => "exists",
            Err(e) => panic!("unexpected error {e:?}"),
        }
    }

    async fn apply(f: &Fixture, m: &mut Model, op: &Op) {
        match op {
            Op::Create { name, len, byte } => {
                let name = NAMES[*name];
                let data = vec![*byte; *len as usize];
                let got = async {
                    let Opened { handle: h, .. } = f.vol.create(&path(name), FILE, 0).await?;
                    f.vol.write(&h, 0, &data, false, false).await?;
                    f.vol.cleanup(&h, false).await?;
                    f.vol.close(h).await;
                    Ok(())
                }
                .await;
                let want = match m.entry(key(name)) {
                    std::collections::btree_map::Entry::Occupied(_) => "exists",
                    std::collections::btree_map::Entry::Vacant(e) => {
                        e.insert((name.to_string(), data));
                        "ok"
                    }
                };
                assert_eq!(kind(&got), want, "{op:?}");
            }
            Op::Overwrite { name, len, byte } => {
                let name = NAMES[*name];
                let data = vec![*byte; *len as usize];
                let got = async {
                    let Opened { handle: h, .. } = f.vol.open(&path(name), FILE).await?;
                    let info = f.vol.overwrite(&h, 0).await?;
                    assert_eq!(info.file_size, 0);
                    f.vol.write(&h, 0, &data, false, false).await?;
                    f.vol.cleanup(&h, false).await?;
                    f.vol.close(h).await;
                    Ok(())
                }
                .await;
                let want = match m.get_mut(&key(name)) {
                    Some(entry) => {
                        entry.1 = data;
                        "ok"
                    }
                    None => "not found",
                };
                assert_eq!(kind(&got), want, "{op:?}");
            }
            Op::WriteAt {
                name,
                offset,
                len,
                byte,
            } => {
                let name = NAMES[*name];
                let data = vec![*byte; *len as usize];
                let got = async {
                    let Opened { handle: h, .. } = f.vol.open(&path(name), FILE).await?;
                    f.vol.write(&h, *offset as u64, &data, false, false).await?;
                    f.vol.cleanup(&h, false).await?;
                    f.vol.close(h).await;
                    Ok(())
                }
                .await;
                let want = match m.get_mut(&key(name)) {
                    Some((_, bytes)) => {
                        let end = *offset as usize + data.len();
                        if bytes.len() < end {
                            bytes.resize(end, 0);
                        }
                        bytes[*offset as usize..end].copy_from_slice(&data);
                        "ok"
                    }
                    None => "not found",
                };
                assert_eq!(kind(&got), want, "{op:?}");
            }
            Op::Rename { from, to, replace } => {
                let (from, to) = (NAMES[*from], NAMES[*to]);
                let got = async {
                    let Opened { handle: h, .. } = f.vol.open(&path(from), FILE).await?;
                    let r = f.vol.rename(&h, &path(to), *replace).await;
                    f.vol.close(h).await;
                    r
                }
                .await;
                let want = match m.remove(&key(from)) {
                    None => "not found",
                    Some((kept, bytes)) if key(from) == key(to) => {
                        // Only the case changes.
                        let _ = kept;
                        m.insert(key(to), (to.to_string(), bytes));
                        "ok"
                    }
                    Some(src) => match m.get(&key(to)).cloned() {
                        Some(_) if !replace => {
                            m.insert(key(from), src);
                            "exists"
                        }
                        // Replaced under the existing name's case.
                        Some((existing, _)) => {
                            m.insert(key(to), (existing, src.1));
                            "ok"
                        }
                        None => {
                            m.insert(key(to), (to.to_string(), src.1));
                            "ok"
                        }
                    },
                };
                assert_eq!(kind(&got), want, "{op:?}");
            }
            Op::Delete { name } => {
                let name = NAMES[*name];
                let got = async {
                    let Opened { handle: h, .. } = f.vol.open(&path(name), FILE).await?;
                    f.vol.set_delete(&h, true).await?;
                    f.vol.cleanup(&h, true).await?;
                    f.vol.close(h).await;
                    Ok(())
                }
                .await;
                let want = match m.remove(&key(name)) {
                    Some(_) => "ok",
                    None => "not found",
                };
                assert_eq!(kind(&got), want, "{op:?}");
            }
            Op::Read { name } => {
                let name = NAMES[*name];
                match m.get(&key(name)) {
                    Some((kept, bytes)) => {
                        // Opened under any case, the file's name is the case it keeps.
                        let o = f.vol.open(&path(name), FILE).await.unwrap();
                        assert_eq!(o.name, path(kept), "{op:?}");
                        f.vol.close(o.handle).await;
                        assert_eq!(&f.read_all(&path(name)).await, bytes)
                    }
                    None => assert!(matches!(
                        f.vol.open(&path(name), ANY).await,
                        Err(FsError::NotFound)
                    )),
                }
            }
            Op::Settle => {
                f.settle().await;
                check_bucket(f, m);
            }
        }
    }

    fn check_bucket(f: &Fixture, m: &Model) {
        let want: BTreeMap<String, Vec<u8>> = m.values().cloned().collect();
        let got: BTreeMap<String, Vec<u8>> = f
            .store
            .keys()
            .into_iter()
            .map(|k| {
                let bytes = f.object(&k).unwrap_or_default();
                (k, bytes)
            })
            .collect();
        assert_eq!(got, want);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn the_volume_behaves_like_a_case_insensitive_map(ops in prop::collection::vec(op(), 1..40)) {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let f = fixture(1 << 20);
                let mut m = Model::new();
                for op in &ops {
                    apply(&f, &mut m, op).await;
                }
                f.settle().await;
                check_bucket(&f, &m);
                // And the listing shows each file once, under the case it keeps.
                let mut names = f.names(r"\").await;
                names.sort();
                let mut want: Vec<String> = m.values().map(|(n, _)| n.clone()).collect();
                want.sort();
                assert_eq!(names, want);
            });
        }
    }
}

/// Sequences a cold review of the kept listings and canonical names found broken.
mod review {
    use super::*;
    use crate::store::memory::FaultConfig;

    /// WinFsp refuses a normalized name that differs from the requested one other than by
    /// case (`STATUS_OBJECT_NAME_INVALID`).
    fn same_but_case(requested: &str, canonical: &str) -> bool {
        fold(requested) == fold(canonical)
    }

    #[tokio::test]
    async fn canonical_name_of_an_exact_object_name_under_a_case_suffix() {
        let f = fixture(1 << 20);
        f.store.insert("Docs/Report.txt", "R");
        f.store.insert("Docs/report.txt", "r");
        let o = f.vol.open(r"\Docs\report.txt", FILE).await.unwrap();
        let before = o.name.clone();
        f.vol.close(o.handle).await;
        f.names(r"\Docs").await; // Explorer shows the folder: its listing is kept
        let o = f.vol.open(r"\Docs\report.txt", FILE).await.unwrap();
        let after = o.name.clone();
        f.vol.close(o.handle).await;
        assert_eq!(before, after, "one file, two canonical names");
        assert!(
            same_but_case(r"\Docs\report.txt", &after),
            "WinFsp refuses {after:?}"
        );
    }

    #[tokio::test]
    async fn canonical_name_of_a_typed_quote_is_not_the_requested_name() {
        let f = fixture(1 << 20);
        let path = "\\\u{201B}draft.txt"; // a quote where the mapping puts none
        let o = f.vol.create(path, FILE, 0).await.unwrap();
        let name = o.name.clone();
        f.vol.cleanup(&o.handle, false).await.unwrap();
        f.vol.close(o.handle).await;
        f.settle().await;
        assert!(
            f.object("\u{201B}draft.txt").is_some(),
            "the core created it"
        );
        assert!(
            same_but_case(path, &name),
            "create answers {name:?} for {path:?}"
        );
    }

    #[tokio::test]
    async fn delete_of_the_plain_name_leaves_its_hidden_case_twin_unfindable() {
        let f = fixture(1 << 20);
        let deep = vec!["d".repeat(250); 4].join("/");
        let (shown, collided) = ("F".repeat(18), "f".repeat(18));
        f.store.insert(&format!("{deep}/{shown}"), "upper");
        f.store.insert(&format!("{deep}/{collided}"), "lower");
        let deep_win = format!("\\{}", deep.replace('/', "\\"));
        assert_eq!(f.names(&deep_win).await, vec![".", "..", shown.as_str()]);
        let upper = format!("{deep_win}\\{shown}");
        let o = f.vol.open(&upper, FILE).await.unwrap();
        f.vol.set_delete(&o.handle, true).await.unwrap();
        f.vol.cleanup(&o.handle, true).await.unwrap();
        f.vol.close(o.handle).await;
        let found = f.vol.open(&upper, FILE).await; // `fff…` in another case
        assert_eq!(f.names(&deep_win).await, vec![".", "..", collided.as_str()]);
        match found {
            Ok(o) => f.vol.close(o.handle).await,
            Err(e) => panic!("{e}: the kept listing lost {collided}"),
        }
    }

    #[tokio::test]
    async fn a_listed_name_can_be_opened() {
        let f = fixture(1 << 20);
        let deep = vec!["d".repeat(250); 4].join("/");
        let name = "x".repeat(20);
        f.store.insert(&format!("{deep}/{name}"), "x");
        let deep_win = format!("\\{}", deep.replace('/', "\\"));
        let listed = f.names(&deep_win).await;
        let path = format!("{deep_win}\\{name}");
        let opened = f.vol.open(&path, FILE).await;
        assert!(
            !listed.contains(&name) || opened.is_ok(),
            "listed but {} units long: {:?}",
            path.encode_utf16().count(),
            opened.err().map(|e| e.to_string())
        );
    }

    #[tokio::test]
    async fn a_create_during_an_enumeration_is_not_lost_from_the_kept_listing() {
        let f = fixture(1 << 20);
        f.store.insert("d/old.txt", "x");
        let Opened { handle: dir, .. } = f.vol.open(r"\d", DIR).await.unwrap();
        let lists = f.store.counts.list.load(Ordering::SeqCst);
        f.store
            .set_faults(Some(FaultConfig::delays(7, Duration::from_millis(300))));
        let done = std::sync::atomic::AtomicBool::new(false);
        let enumeration = async {
            let page = f.vol.read_directory(&dir, None).await;
            done.store(true, Ordering::SeqCst);
            page
        };
        let create = async {
            while f.store.counts.list.load(Ordering::SeqCst) == lists {
                tokio::task::yield_now().await; // until the enumeration's LIST is in flight
            }
            f.store.set_faults(None);
            // Explorer's copy: created and being written, not uploaded yet.
            let o = f.vol.create(r"\d\new.txt", FILE, 0).await.unwrap();
            f.vol.write(&o.handle, 0, b"n", false, false).await.unwrap();
            (o.handle, !done.load(Ordering::SeqCst))
        };
        let (page, (new, raced)) = tokio::join!(enumeration, create);
        page.unwrap();
        assert!(raced, "no race");
        f.vol.cleanup(&new, false).await.unwrap();
        f.vol.close(new).await;
        f.vol.close(dir).await;
        let open_ok = f.vol.open(r"\d\NEW.TXT", FILE).await.is_ok();
        let again_ok = f.vol.create(r"\d\NEW.TXT", FILE, 0).await.is_ok();
        assert!(
            open_ok && !again_ok,
            "open NEW.TXT: {open_ok}; created NEW.TXT too: {again_ok}"
        );
    }

    #[tokio::test]
    async fn a_mkdir_whose_answer_was_lost_is_not_hidden_by_the_kept_listing() {
        let f = fixture(1 << 20);
        f.store.insert("d/a.txt", "a");
        f.names(r"\d").await;
        f.store.set_faults(Some(FaultConfig {
            seed: 1,
            fail_before: 0.0,
            fail_after: 1.0,
            max_delay: Duration::ZERO,
        }));
        let made = f.vol.create(r"\d\New Folder", DIR, 0).await;
        f.store.set_faults(None);
        assert!(made.is_err() && f.object("d/New Folder/").is_some());
        let open_ok = f.vol.open(r"\d\NEW FOLDER", DIR).await.is_ok();
        let again_ok = f.vol.create(r"\d\new folder", DIR, 0).await.is_ok();
        let keys = f.store.keys();
        assert!(
            open_ok && !again_ok,
            "open: {open_ok}; second mkdir: {again_ok}; {keys:?}"
        );
    }
}

/// WinFsp passes the create disposition in the options' top byte: only `FILE_CREATE`
/// (`CREATE_NEW`) asks for a new name; `FILE_OPEN_IF` and `FILE_OVERWRITE_IF` reach create too.
#[test]
fn the_disposition_says_which_creates_must_be_new() {
    let opts = |disposition: u32| {
        OpenOptions::from_create_options(disposition << 24 | FILE_NON_DIRECTORY_FILE)
    };
    assert!(opts(FILE_CREATE).create_new);
    assert!(opts(FILE_CREATE).non_directory);
    for other in [0, 1, 3, 4, 5] {
        assert!(!opts(other).create_new, "disposition {other}");
    }
}

/// `CREATE_NEW` of one name on two machines with `--exclusive-create`: exactly one wins, the
/// other gets a name collision, and the bucket ends with the winner's bytes (I12).
#[tokio::test]
async fn create_new_on_two_volumes_lets_exactly_one_win() {
    let store = Arc::new(MemoryStore::new());
    let dir = tempfile::tempdir().unwrap();
    let volume = |name: &str| {
        let mut w = WriteConfig::new(dir.path().join(name));
        w.write_back_delay = Duration::from_millis(0);
        let mut cfg = MountConfig::new("bkt");
        cfg.exclusive_create = true;
        let fs = Filesystem::with_write(store.clone(), cfg, w).unwrap();
        Volume::new(Arc::new(fs), "bkt")
    };
    let (a, b) = (volume("a"), volume("b"));
    let new = OpenOptions {
        create_new: true,
        ..FILE
    };
    for v in [&a, &b] {
        assert!(matches!(
            v.open(r"\New.txt", FILE).await,
            Err(FsError::NotFound)
        ));
    }
    let (ra, rb) = tokio::join!(a.create(r"\New.txt", new, 0), b.create(r"\New.txt", new, 0));
    let (winner, opened, lost) = match (ra, rb) {
        (Ok(o), Err(e)) => (&a, o, e),
        (Err(e), Ok(o)) => (&b, o, e),
        (ra, rb) => panic!("exactly one must win: {:?} / {:?}", ra.err(), rb.err()),
    };
    assert_eq!(lost, FsError::Exists);
    assert_eq!(lost.ntstatus(), 0xC000_0035, "STATUS_OBJECT_NAME_COLLISION");
    winner
        .write(&opened.handle, 0, b"winner", false, false)
        .await
        .unwrap();
    winner.cleanup(&opened.handle, false).await.unwrap();
    winner.close(opened.handle).await;
    a.filesystem().drain(false).await;
    b.filesystem().drain(false).await;
    assert_eq!(
        store.object_bytes("New.txt").as_deref(),
        Some(&b"winner"[..])
    );
    assert_eq!(store.keys(), vec!["New.txt"]);
}
