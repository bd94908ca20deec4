//! The multi-mount simulation: two or three mounts, each with its own cache directory, on one
//! `MemoryStore`, and an outside writer that creates, replaces and deletes objects directly.
//!
//! One seed drives everything, as in the single-mount simulation. Each mount incarnation has
//! its own single-threaded tokio runtime with a paused clock, so a crash of one mount drops its
//! runtime (its tasks stop wherever they were) and leaves the others running. The runtimes are
//! kept on one simulated clock by running them in lock step: time advances in quanta of
//! [`QUANTUM`], and in each quantum every mount's runtime runs, in mount order, up to the same
//! instant; the operation of the step is polled on its mount's runtime within those slices.
//! The core's wall clock (`fs_core::clock`) follows the same simulated time, so conflict-copy
//! names, object update times and mtimes replay exactly. The stat and negative caches run on
//! moka's own clock; as in the single-mount simulation their TTLs are an hour, so they never
//! expire during a run whatever the machine's speed.
//!
//! Because only one runtime runs at a time, every change to the bucket is attributed exactly:
//! after each mount's slice the bucket is compared with what it held before, and each new or
//! vanished generation is charged to that mount (the outside writer's changes are made between
//! slices). The checks:
//!
//! - I2: a generation a mount makes holds bytes some state of one of its files had, or bytes of
//!   a generation that existed (a rename copies).
//! - I3: a mount never uploads its own bytes under a name its user deleted or renamed away.
//! - I4: a conflict copy is named `NAME.conflict-<stamp>-<tag>` with the tag of the mount that
//!   made it, holds bytes of a version that mount acknowledged (or may have committed), and is
//!   made only when another writer touched NAME.
//! - I8: a mount deletes or replaces only a generation its user saw (a lookup returned it) or
//!   that it made itself.
//! - I9: after the final drain every version a mount acknowledged and did not itself
//!   supersede or remove is in the bucket (under any name: the object or a conflict copy),
//!   unless another writer that saw it replaced or removed it. Versions a mount reports as
//!   unsaved (kept staged) are listed, not failed.
//! - I6 and I7 after the final drain, per mount: the drain finishes; no temporary part is left.
//! - VIEW: what a mount shows after a close is some version of the name with the user's writes
//!   applied, and a read never shows bytes nobody wrote.
//!
//! A directory rename (`mv d1 d2`, either way) moves every object under the directory, whoever
//! wrote it: its copies are checked as moves of what the directory held (under the same name,
//! or beside an object under the new name as a conflict copy), and it may delete what its
//! listing saw (see [`Moving`]).
//!
//! I10-I12 are left to their own checks: see [`Sim::hooks`].
//!
//! Environment: as the single-mount simulation (`SIM_SEED`, `SIM_SEEDS`, `SIM_OPS`,
//! `SIM_VERBOSE`, `SIM_LOG`), plus `SIM_MOUNTS` (2 or 3, default 2) and `SIM_ALLOW`, a comma
//! list of invariants (e.g. `I8,I9`) whose failures are reported with their seeds but do not
//! fail the test.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use fs_core::filesystem::{Filesystem, TEMP_DIR};
use fs_core::store::memory::MemoryStore;
use fs_core::{FsError, FsResult, Ino, Kind, ROOT_INO};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use tokio::runtime::Runtime;
use tokio::time::Instant;

use super::corelog::CoreLog;
use super::fsview::{outcome, read_all, show, show_status};
use super::model::{digest, Digest, FileId, MFile, Model};
use super::{
    drain_bounded, env_num, mix, mount_config, panic_message, runtime, store_retry, violation,
    write_config, Check, Fs, Params, Violation, STEP_LIMIT, W, WT,
};

/// The simulated time one lock-step slice covers.
const QUANTUM: Duration = Duration::from_millis(1);
const NAMES: [&str; 5] = ["a", "b", "c.txt", "d1/a", "d1/b"];
const DIR: &str = "d1";
const MAX_HANDLES: usize = 3;

/// Where the simulated wall clock starts: 2026-11-30T00:53:20Z.
const EPOCH_SECS: u64 = 1_796_000_000;

thread_local! {
    /// Simulated time since the seed began, for the core's wall clock.
    static SIM_NOW: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::ZERO) };
}

fn sim_wall_clock() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(EPOCH_SECS) + SIM_NOW.with(|c| c.get())
}

fn temp_of(path: &str) -> String {
    match path.rsplit_once('/') {
        Some((d, _)) => format!("{d}/~tmp"),
        None => "~tmp".to_string(),
    }
}

/// The name a conflict copy was made for, if `key` is one.
fn conflict_base(key: &str) -> Option<&str> {
    key.find(".conflict-").map(|i| &key[..i])
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Party {
    /// The bucket as the seed made it.
    Seed,
    Outside,
    Mount(usize),
}

impl std::fmt::Display for Party {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Party::Seed => write!(f, "the initial bucket"),
            Party::Outside => write!(f, "the outside writer"),
            Party::Mount(m) => write!(f, "mount {m}"),
        }
    }
}

/// One generation ever seen in the bucket.
#[derive(Debug, Clone)]
struct Gen {
    owner: Party,
    digest: Digest,
}

/// What the bucket held and who made or destroyed each generation.
#[derive(Debug, Default)]
struct Bucket {
    /// The live generation of each name at the last scan (temporary parts and markers aside).
    snap: BTreeMap<String, i64>,
    gens: BTreeMap<(String, i64), Gen>,
    /// Bytes of every generation that ever lived under each name.
    bytes_under: BTreeMap<String, Vec<Bytes>>,
    /// Bytes of each generation.
    gen_bytes: BTreeMap<(String, i64), Bytes>,
    /// Conflict copies made: (key, the mount that made it, its content), checked once the
    /// step that made them has told its user the outcome.
    conflicts: Vec<(String, usize, Digest)>,
    /// Digests of every generation ever made.
    all: HashSet<Digest>,
    /// Versions destroyed by another writer entitled to (the outside writer, or a mount that saw
    /// the generation): not owed by their author any more.
    excused: HashSet<Digest>,
    /// Which parties made or removed a generation of each name (a copy of another party's
    /// bytes counts as theirs too).
    touched: BTreeMap<String, BTreeSet<Party>>,
    /// Who first made each content.
    author: HashMap<Digest, Party>,
    /// Contents destroyed by a mount that never saw them (I8), and how.
    destroyed_unseen: HashMap<Digest, String>,
    /// The first violation a scan found (a scan runs inside the lock step and cannot return).
    found: Option<Violation>,
    /// Invariants whose violations are recorded and passed over (`SIM_ALLOW`).
    allow: BTreeSet<String>,
    /// A violation whose class contains this is never passed over (`SIM_CLASS`).
    fatal: Option<String>,
    /// Violations passed over.
    tolerated: Vec<Violation>,
    /// The kind of operation under way, which names a scan's violations' class.
    ctx: String,
    /// A directory rename under way.
    moving: Option<Moving>,
    /// Log lines the scans made, taken by the next note.
    lines: Vec<String>,
}

/// A directory rename under way. Its copies move objects, whoever wrote them, and may go
/// beside an object under the new name as conflict copies; it deletes what its listing saw.
#[derive(Debug)]
struct Moving {
    mount: usize,
    from: String,
    to: String,
    /// (name under `from`, content) of every object there since the rename began (other
    /// mounts' uploads run meanwhile, and the listing may see what they make).
    had: HashSet<(String, Digest)>,
    /// Every generation under `from` since the rename began: what its listing may have seen.
    seen: HashSet<(String, i64)>,
}

/// A handle the simulated user of one mount holds open for writing.
#[derive(Debug, Clone)]
struct Handle {
    fh: u64,
    file: FileId,
}

#[derive(Debug, Clone)]
enum Edit {
    Write(usize, Vec<u8>),
    Truncate(usize),
}

fn apply(base: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut v = base.to_vec();
    for e in edits {
        match e {
            Edit::Write(off, data) => {
                let end = off + data.len();
                if v.len() < end {
                    v.resize(end, 0);
                }
                v[*off..end].copy_from_slice(data);
            }
            Edit::Truncate(len) => v.resize(*len, 0),
        }
    }
    v
}

/// One mount: its cache directory, its current incarnation, and the model of what its user did.
struct Mount {
    tag: String,
    cache_dir: PathBuf,
    rt: Option<Runtime>,
    fs: Option<Fs>,
    /// This incarnation's runtime clock at simulated time `g0`.
    base: Instant,
    g0: Duration,
    incarnation: u32,
    handles: Vec<Handle>,
    model: Model,
    /// Per file, the content the model last knew the mount to hold, and the user's changes
    /// since (through any handle): what a save must show is those changes on some version.
    edits: BTreeMap<FileId, (Vec<u8>, Vec<Edit>)>,
    /// Generations this mount's user saw: (key, generation) from the attributes of a lookup.
    seen: BTreeSet<(String, i64)>,
    /// Every content any of its files had (the user's states).
    wrote: HashSet<Digest>,
    /// Every version it acknowledged or may have committed.
    acked_ever: HashSet<Digest>,
    /// Files that vanished from this mount's view not by its user's doing (another writer
    /// deleted or replaced them): their acknowledged version is still owed.
    orphans: Vec<(FileId, MFile)>,
    /// Files left staged and reported unsaved after the final drain.
    unsaved: u64,
    /// Files whose last close this mount's user was told failed with `ESTALE`: some of their
    /// bytes belonged to a generation another writer replaced. If that generation is gone,
    /// those bytes cannot be read (I9: kept staged, reported unsaved), and a read may fail.
    told_stale: BTreeSet<FileId>,
    /// Contents the mount showed after a save that are no version with the user's writes.
    mixed: HashSet<Digest>,
}

impl Mount {
    fn fs(&self) -> &Fs {
        self.fs.as_ref().expect("mounted")
    }

    fn at(&self, t: Duration) -> Instant {
        self.base + t.saturating_sub(self.g0)
    }

    /// Notes a change the user makes to `file`, before the model applies it.
    fn edit(&mut self, file: FileId, e: Edit) {
        let current = self.model.file(file).current.clone();
        self.edits
            .entry(file)
            .or_insert_with(|| (current, Vec::new()))
            .1
            .push(e);
    }

    /// Remembers the current content of every file as something this mount's user had.
    fn remember(&mut self) {
        for f in self.model.files.values() {
            self.wrote.insert(digest(&f.current));
        }
    }
}

/// Runs `fut` on mount `active`'s runtime while every mount's runtime advances in lock step;
/// after each mount's slice the bucket is scanned and its changes charged to that mount.
fn drive<T>(
    mounts: &[Mount],
    bucket: &mut Bucket,
    store: &MemoryStore,
    now: &mut Duration,
    active: usize,
    fut: impl Future<Output = T>,
    limit: Duration,
) -> Check<T> {
    let mut fut = std::pin::pin!(fut);
    let start = *now;
    loop {
        *now += QUANTUM;
        SIM_NOW.with(|c| c.set(*now));
        let mut out = None;
        for (i, m) in mounts.iter().enumerate() {
            let Some(rt) = m.rt.as_ref() else { continue };
            let target = m.at(*now);
            if i == active {
                out =
                    rt.block_on(async { tokio::time::timeout_at(target, fut.as_mut()).await.ok() });
            } else {
                rt.block_on(async { tokio::time::sleep_until(target).await });
            }
            scan(bucket, mounts, store, Party::Mount(i));
        }
        if let Some(v) = bucket.found.take() {
            return Err(v);
        }
        if let Some(r) = out {
            return Ok(r);
        }
        if *now - start >= limit {
            return Err(violation(
                "I6",
                "an operation hung",
                format!("a step of mount {active} did not finish within {limit:?} (simulated)"),
            ));
        }
    }
}

/// Compares the bucket with the last scan and charges every change to `party`.
fn scan(bucket: &mut Bucket, mounts: &[Mount], store: &MemoryStore, party: Party) {
    let objects = store.objects();
    let live: BTreeMap<&str, (i64, &Bytes)> = objects
        .iter()
        .filter(|(k, _, _)| !k.starts_with(&format!("{TEMP_DIR}/")) && !k.ends_with('/'))
        .map(|(k, g, b)| (k.as_str(), (*g, b)))
        .collect();
    if let Some(mv) = bucket.moving.as_mut() {
        for (k, (g, b)) in &live {
            if let Some(rest) = k.strip_prefix(mv.from.as_str()) {
                mv.had.insert((rest.to_string(), digest(b)));
                mv.seen.insert((k.to_string(), *g));
            }
        }
    }
    // Vanished generations: replaced or deleted by `party`.
    let gone: Vec<(String, i64)> = bucket
        .snap
        .iter()
        .filter(|(k, g)| live.get(k.as_str()).is_none_or(|(now, _)| now != *g))
        .map(|(k, g)| (k.clone(), *g))
        .collect();
    for (k, g) in gone {
        let how = if live.contains_key(k.as_str()) {
            "replaced"
        } else {
            "deleted"
        };
        bucket.snap.remove(&k);
        bucket.touched.entry(k.clone()).or_default().insert(party);
        let Some(gen) = bucket.gens.get(&(k.clone(), g)).cloned() else {
            continue;
        };
        bucket.lines.push(format!(
            "bucket: {party} {how} {k}#{g} ({})",
            gen_name(&gen)
        ));
        if gen.owner == party {
            continue;
        }
        if let Party::Mount(m) = party {
            let listed = bucket
                .moving
                .as_ref()
                .is_some_and(|mv| mv.mount == m && mv.seen.contains(&(k.clone(), g)));
            if !mounts[m].seen.contains(&(k.clone(), g)) && !listed {
                bucket.flag(violation(
                    "I8",
                    if how == "deleted" {
                        "a mount deleted a generation its user never saw"
                    } else {
                        "a mount replaced a generation its user never saw"
                    },
                    format!(
                        "mount {m} {how} {k} generation {g}, made by {} ({}), which its user \
                         never saw",
                        gen.owner,
                        show_digest(gen.digest)
                    ),
                ));
                // Not excused: the version's author still needs it.
                bucket
                    .destroyed_unseen
                    .insert(gen.digest, format!("mount {m} {how} {k}#{g}"));
                continue;
            }
        }
        bucket.excused.insert(gen.digest);
    }
    // New generations, made by `party`.
    for (k, (g, data)) in live {
        if bucket.snap.get(k) == Some(&g) {
            continue;
        }
        let d = digest(data);
        bucket.snap.insert(k.to_string(), g);
        bucket
            .touched
            .entry(k.to_string())
            .or_default()
            .insert(party);
        let known = bucket.all.contains(&d);
        bucket.all.insert(d);
        let author = *bucket.author.entry(d).or_insert(party);
        bucket
            .touched
            .entry(k.to_string())
            .or_default()
            .insert(author);
        bucket
            .bytes_under
            .entry(k.to_string())
            .or_default()
            .push(data.clone());
        let gen = Gen {
            owner: party,
            digest: d,
        };
        bucket
            .lines
            .push(format!("bucket: {party} made {k}#{g} = {}", show(data)));
        bucket.gens.insert((k.to_string(), g), gen);
        bucket.gen_bytes.insert((k.to_string(), g), data.clone());
        if let Party::Mount(m) = party {
            if moved_by_rename(bucket, &mounts[m], m, k, d) {
                continue;
            }
        }
        if let (Some(_), Party::Mount(m)) = (conflict_base(k), party) {
            bucket.conflicts.push((k.to_string(), m, d));
        }
        if bucket.found.is_some() {
            continue;
        }
        if let Party::Mount(m) = party {
            if let Some(v) = check_new(&mounts[m], m, bucket, k, g, d, known) {
                bucket.flag(v);
            }
        }
    }
}

impl Bucket {
    /// A violation found by a scan: kept for the step to return, or passed over if allowed.
    fn flag(&mut self, mut v: Violation) {
        if !v.class.contains(" (in ") {
            v.class = format!("{} (in {})", v.class, self.ctx);
        }
        let fatal = self
            .fatal
            .as_ref()
            .is_some_and(|f| v.class.contains(f.as_str()));
        if self.allow.contains(v.inv) && !fatal {
            self.lines
                .push(format!("VIOLATION (allowed) [{}] {}", v.inv, v.detail));
            self.tolerated.push(v);
        } else if self.found.is_none() {
            self.found = Some(v);
        }
    }
}

fn gen_name(g: &Gen) -> String {
    format!("by {}, {}", g.owner, show_digest(g.digest))
}

fn show_digest(d: Digest) -> String {
    format!("{}B#{:04x}", d.0, d.1 & 0xffff)
}

/// Whether generation `key` (content `d`) that mount `m` just made is its directory rename's
/// copy of an object the directory held: under the same name, or beside one under the new name
/// as a conflict copy with `m`'s tag. Such a copy moves someone's bytes and is checked as a
/// rename (I8 for what it deletes), not as a save.
fn moved_by_rename(bucket: &Bucket, mount: &Mount, m: usize, key: &str, d: Digest) -> bool {
    let Some(mv) = &bucket.moving else {
        return false;
    };
    let Some(rest) = key.strip_prefix(mv.to.as_str()).filter(|_| mv.mount == m) else {
        return false;
    };
    let beside = conflict_base(rest).filter(|_| key.ends_with(&format!("-{}", mount.tag)));
    let moved = |name: &str| mv.had.contains(&(name.to_string(), d));
    moved(rest) || beside.is_some_and(moved)
}

/// I2, I3 and I4 for a generation mount `m` just made.
fn check_new(
    mount: &Mount,
    m: usize,
    bucket: &Bucket,
    key: &str,
    g: i64,
    d: Digest,
    existed: bool,
) -> Option<Violation> {
    if let Some(base) = conflict_base(key) {
        let tagged = key.ends_with(&format!("-{}", mount.tag));
        if !tagged {
            return Some(violation(
                "I4",
                "a conflict copy does not carry its mount's tag",
                format!("mount {m} (tag {}) made conflict copy {key}", mount.tag),
            ));
        }
        if !mount.wrote.contains(&d) && !mount.acked_ever.contains(&d) {
            return Some(violation(
                "I4",
                "a conflict copy holds bytes its mount's user never had",
                format!(
                    "mount {m} made conflict copy {key}#{g} holding {}, which no file of its \
                     user ever held",
                    show_digest(d)
                ),
            ));
        }
        // A conflict copy a directory rename moved was made for its name under the old prefix.
        let old_name = bucket
            .moving
            .as_ref()
            .filter(|mv| mv.mount == m)
            .and_then(|mv| {
                base.strip_prefix(mv.to.as_str())
                    .map(|r| format!("{}{r}", mv.from))
            });
        // An update of a conflict copy this mount made before, under this very name: its file
        // went beside another writer's change and lives at the copy (which a directory rename
        // may have moved since). That conflict was checked when the copy was first made.
        let updates_own = (bucket.gens)
            .range((key.to_string(), i64::MIN)..(key.to_string(), g))
            .any(|(_, gen)| gen.owner == Party::Mount(m));
        let others = updates_own
            || [Some(base.to_string()), old_name]
                .into_iter()
                .flatten()
                .any(|b| {
                    bucket
                        .touched
                        .get(&b)
                        .is_some_and(|t| t.iter().any(|p| *p != Party::Mount(m)))
                });
        if !others {
            return Some(violation(
                "I4",
                "a conflict copy was made though nobody else touched the name",
                format!("mount {m} made {key}, but no other writer ever changed {base}"),
            ));
        }
        return None;
    }
    if mount.mixed.contains(&d) {
        return Some(violation(
            "I2",
            "a mount uploaded bytes no version had",
            format!(
                "mount {m} made {key}#{g} holding {}, which it showed after a save though it is \
                 no version with its user's writes",
                show_digest(d)
            ),
        ));
    }
    let own = mount.wrote.contains(&d);
    if !own && !existed {
        return Some(violation(
            "I2",
            "the bucket holds bytes nobody wrote",
            format!(
                "mount {m} made {key}#{g} holding {}, which no state of its files and no \
                 generation ever had",
                show_digest(d)
            ),
        ));
    }
    if own && !existed && !mount.model.history.get(key).is_some_and(|h| h.contains(&d)) {
        return Some(violation(
            "I3",
            "a mount uploaded a file under a name it no longer has",
            format!(
                "mount {m} made {key}#{g} holding {}, a state of a file its user deleted or \
                 renamed away from {key}, or that never lived there",
                show_digest(d)
            ),
        ));
    }
    None
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Create,
    OpenWrite,
    Append,
    Rewrite,
    HandleWrite,
    HandleClose,
    HandleFsync,
    Truncate,
    Rename,
    RenameDir,
    Unlink,
    Save,
    Read,
    Crash,
    Sleep,
}

struct Sim {
    seed: u64,
    rng: StdRng,
    params: Params,
    store: Arc<MemoryStore>,
    _tmp: tempfile::TempDir,
    mounts: Vec<Mount>,
    bucket: Bucket,
    now: Duration,
    faults_on: bool,
    step: usize,
    /// The step under way, named in the log if it fails.
    doing: String,
    log: Vec<String>,
    core_log: Option<(CoreLog, tracing::subscriber::DefaultGuard)>,
}

/// What a mount shows at a path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Missing,
    Dir,
    File(Vec<u8>, i64),
    Failed(FsError),
}

impl std::fmt::Display for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Seen::Missing => write!(f, "missing"),
            Seen::Dir => write!(f, "a directory"),
            Seen::File(d, g) => write!(f, "{} (generation {g})", show(d)),
            Seen::Failed(e) => write!(f, "error ({e})"),
        }
    }
}

async fn lookup_path(fs: &Fs, path: &str) -> FsResult<fs_core::Attr> {
    let mut ino = ROOT_INO;
    let mut attr = None;
    for part in path.split('/') {
        let a = fs.lookup(ino, part).await?;
        ino = a.ino;
        attr = Some(a);
    }
    attr.ok_or(FsError::NotFound)
}

/// Looks `path` up and reads it whole, as `cat` does (a stale answer is retried).
async fn look(fs: &Fs, path: &str) -> Seen {
    let mut last = FsError::Stale;
    for _ in 0..3 {
        let attr = match lookup_path(fs, path).await {
            Ok(a) => a,
            Err(FsError::NotFound) | Err(FsError::NotDir) => return Seen::Missing,
            Err(e) => return Seen::Failed(e),
        };
        if attr.kind == Kind::Dir {
            return Seen::Dir;
        }
        match read_all(fs, attr.ino).await {
            Ok(d) => return Seen::File(d, attr.generation),
            Err(FsError::Stale) => last = FsError::Stale,
            Err(FsError::NotFound) => return Seen::Missing,
            Err(e) => return Seen::Failed(e),
        }
    }
    Seen::Failed(last)
}

impl Sim {
    fn new(seed: u64, mounts: usize, allow: &BTreeSet<String>) -> Check<Self> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5a5a_0000);
        let params = Params::new(seed, &mut rng);
        let tmp = tempfile::tempdir().expect("a temporary directory");
        let store = Arc::new(MemoryStore::new());
        store.set_retry(Some(store_retry()));
        fs_core::platform::set_inline_blocking(true);
        fs_core::store::retry::seed_jitter(Some(mix(seed, 0x1177)));
        fs_core::clock::set_thread_source(Some(sim_wall_clock));
        SIM_NOW.with(|c| c.set(Duration::ZERO));
        let mut list = Vec::new();
        for m in 0..mounts {
            let cache_dir = tmp.path().join(format!("cache-{m}"));
            std::fs::create_dir_all(&cache_dir).expect("the cache directory");
            let tag = format!("{:016x}", mix(seed, 0x7a9 + m as u64));
            std::fs::write(cache_dir.join("mount-id"), &tag).expect("the cache directory's tag");
            list.push(Mount {
                tag,
                cache_dir,
                rt: None,
                fs: None,
                base: Instant::now(),
                g0: Duration::ZERO,
                incarnation: 0,
                handles: Vec::new(),
                model: Model::default(),
                edits: BTreeMap::new(),
                seen: BTreeSet::new(),
                wrote: HashSet::new(),
                acked_ever: HashSet::new(),
                orphans: Vec::new(),
                unsaved: 0,
                told_stale: BTreeSet::new(),
                mixed: HashSet::new(),
            });
        }
        let mut sim = Sim {
            seed,
            rng,
            params,
            store,
            _tmp: tmp,
            mounts: list,
            bucket: Bucket {
                allow: allow.clone(),
                fatal: std::env::var("SIM_CLASS").ok().filter(|c| !c.is_empty()),
                ..Bucket::default()
            },
            now: Duration::ZERO,
            faults_on: false,
            step: 0,
            doing: String::new(),
            log: Vec::new(),
            core_log: CoreLog::install(),
        };
        sim.seed_bucket();
        for m in 0..mounts {
            sim.mount(m)?;
        }
        sim.faults_on =
            sim.params.faults.fail_before > 0.0 || sim.params.faults.max_delay > Duration::ZERO;
        sim.apply_faults();
        Ok(sim)
    }

    fn seed_bucket(&mut self) {
        self.store.insert(&format!("{DIR}/"), Vec::new());
        for m in &mut self.mounts {
            m.model.dirs.insert(DIR.to_string());
        }
        let mut files = Vec::new();
        for name in NAMES {
            if self.rng.gen_bool(0.4) {
                let len = self.size();
                let data = self.bytes(len);
                self.store.insert(name, data);
                files.push(name);
            }
        }
        scan(&mut self.bucket, &self.mounts, &self.store, Party::Seed);
        self.bucket.lines.clear();
        self.note(
            None,
            format!(
                "{} mounts; the bucket starts with {DIR}/ and {files:?}",
                self.mounts.len()
            ),
        );
    }

    fn apply_faults(&self) {
        self.store
            .set_faults(self.faults_on.then_some(self.params.faults));
    }

    fn faulty(&self) -> bool {
        self.faults_on
            && (self.params.faults.fail_before > 0.0 || self.params.faults.fail_after > 0.0)
    }

    fn note(&mut self, m: Option<usize>, line: String) {
        if let Some((core, _)) = &self.core_log {
            for l in core.take_lines() {
                self.log.push(format!("        core: {l}"));
            }
        }
        for l in std::mem::take(&mut self.bucket.lines) {
            self.log.push(format!("        {l}"));
        }
        let who = match m {
            Some(m) => format!("mount {m}.{}", self.mounts[m].incarnation),
            None => "outside".to_string(),
        };
        self.log.push(format!(
            "#{:<3} [{who} t={}ms] {line}",
            self.step,
            self.now.as_millis()
        ));
    }

    /// Runs `f`'s future on mount `m` in lock step with the others, bounded by the step limit.
    fn run<'a, T, Fut>(&'a mut self, m: usize, f: impl FnOnce(&'a Fs) -> Fut) -> Check<T>
    where
        Fut: Future<Output = T> + 'a,
    {
        let Sim {
            mounts,
            bucket,
            store,
            now,
            ..
        } = self;
        let mounts: &'a [Mount] = mounts;
        let fut = f(mounts[m].fs());
        drive(mounts, bucket, store, now, m, fut, STEP_LIMIT)
    }

    /// Runs `f`'s future on mount `m` alone, the others held where they are, with the bucket
    /// healthy: a look at what the mount shows, which must not let anything else happen.
    fn alone<'a, T, Fut>(&'a mut self, m: usize, f: impl FnOnce(&'a Fs) -> Fut) -> Check<T>
    where
        Fut: Future<Output = T> + 'a,
    {
        let Sim {
            mounts,
            bucket,
            store,
            now,
            params,
            faults_on,
            ..
        } = self;
        let mounts: &'a [Mount] = mounts;
        store.set_faults(None);
        let mount = &mounts[m];
        let rt = mount.rt.as_ref().expect("a runtime");
        let out = rt.block_on(f(mount.fs()));
        let t = rt.block_on(async { Instant::now() });
        *now = (*now).max(t - mount.base + mount.g0);
        SIM_NOW.with(|c| c.set(*now));
        store.set_faults(faults_on.then_some(params.faults));
        scan(bucket, mounts, store, Party::Mount(m));
        match bucket.found.take() {
            Some(v) => Err(v),
            None => Ok(out),
        }
    }

    fn mount(&mut self, m: usize) -> Check {
        let rt = runtime();
        let fs = {
            let _guard = rt.enter();
            Filesystem::with_write(
                self.store.clone(),
                mount_config(),
                write_config(self.mounts[m].cache_dir.clone(), &self.params),
            )
            .map_err(|e| violation("I1", "a restart could not mount", e))?
        };
        let base = rt.block_on(async { Instant::now() });
        let mount = &mut self.mounts[m];
        mount.base = base;
        mount.g0 = self.now;
        mount.rt = Some(rt);
        mount.fs = Some(fs);
        match self.run(m, |fs| fs.start())? {
            Ok(n) => self.note(
                Some(m),
                format!("mounted; start() replayed {n} staged files"),
            ),
            Err(e) => {
                return Err(violation(
                    "I1",
                    "start() failed",
                    format!("mount {m}: start() failed: {e}"),
                ))
            }
        }
        Ok(())
    }

    // -- random choices ------------------------------------------------------------------------

    fn size(&mut self) -> usize {
        match self.rng.gen_range(0..100) {
            0..=59 => self.rng.gen_range(0..4096),
            60..=89 => self.rng.gen_range(4096..65_536),
            _ => self.rng.gen_range(65_536..150_000),
        }
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.rng.fill_bytes(&mut v);
        v
    }

    fn pick<T: Clone>(&mut self, v: &[T]) -> Option<T> {
        (!v.is_empty()).then(|| v[self.rng.gen_range(0..v.len())].clone())
    }

    fn offset_for(&mut self, size: usize) -> usize {
        match self.rng.gen_range(0..10) {
            0..=4 => self.rng.gen_range(0..=size),
            5 | 6 => size,
            _ => size + self.rng.gen_range(0..10_000),
        }
    }

    fn live(&self, m: usize) -> Vec<String> {
        self.mounts[m]
            .model
            .names
            .keys()
            .filter(|k| NAMES.contains(&k.as_str()))
            .cloned()
            .collect()
    }

    fn pick_live(&mut self, m: usize) -> Option<String> {
        let held: Vec<String> = self.mounts[m]
            .handles
            .iter()
            .filter_map(|h| self.mounts[m].model.files.get(&h.file)?.path.clone())
            .collect();
        if !held.is_empty() && self.rng.gen_bool(0.5) {
            return self.pick(&held);
        }
        let live = self.live(m);
        self.pick(&live)
    }

    /// Names the operation under way, for the log line of a step that fails inside it.
    fn doing(&mut self, m: usize, what: String) {
        self.bucket.ctx = what.split(' ').next().unwrap_or_default().to_string();
        self.doing = format!("[mount {m}.{}] {what}", self.mounts[m].incarnation);
    }

    // -- the model's view ----------------------------------------------------------------------

    /// The file at `path` vanished from mount `m`'s view, not by its user: its acknowledged
    /// version is still owed.
    fn orphan(&mut self, m: usize, path: &str) {
        let mount = &mut self.mounts[m];
        if let Some(id) = mount.model.names.remove(path) {
            mount.edits.remove(&id);
            let f = mount.model.files.get_mut(&id).expect("a live file");
            mount.orphans.push((id, f.clone()));
            f.path = None;
        }
    }

    /// A lookup of `path` on mount `m`, as the kernel makes before any operation on a name:
    /// the generation it returns is one the user saw.
    fn lookup(&mut self, m: usize, path: &str) -> Check<Option<FsResult<fs_core::Attr>>> {
        let p = path.to_string();
        let r = self.run(m, |fs| async move { lookup_path(fs, &p).await })?;
        match &r {
            Ok(a) if a.kind == Kind::File => {
                self.mounts[m].seen.insert((path.to_string(), a.generation));
                self.refresh(m, path, a.generation);
            }
            Ok(_) => {}
            Err(FsError::NotFound) => {}
            Err(e) => {
                self.note(
                    Some(m),
                    format!("(lookup of {path} failed: {e}; step skipped)"),
                );
                return Ok(None);
            }
        }
        Ok(Some(r))
    }

    /// A lookup on mount `m` showed generation `g` of `path`: if it is another writer's
    /// version and the user has no changes in hand, the user's file is that version from now.
    fn refresh(&mut self, m: usize, path: &str, g: i64) {
        let Some(data) = self.bucket.gen_bytes.get(&(path.to_string(), g)).cloned() else {
            return;
        };
        let mount = &mut self.mounts[m];
        let Some(id) = mount.model.live(path) else {
            return;
        };
        let busy = mount.edits.contains_key(&id) || mount.handles.iter().any(|h| h.file == id);
        if busy || mount.model.file(id).current == data {
            return;
        }
        mount.model.set_current(id, data.to_vec());
        mount.remember();
        self.note(
            Some(m),
            format!(
                "  ({path} shows generation {g}, {}, from now on)",
                show(&data)
            ),
        );
    }

    /// The parent inode and name of `path`.
    fn parent(&mut self, m: usize, path: &str) -> Check<Option<(Ino, String)>> {
        let Some((dir, name)) = path.rsplit_once('/') else {
            return Ok(Some((ROOT_INO, path.to_string())));
        };
        let (dir, name) = (dir.to_string(), name.to_string());
        match self.lookup(m, &dir)? {
            Some(Ok(a)) if a.kind == Kind::Dir => Ok(Some((a.ino, name))),
            None => Ok(None),
            // A directory rename (of any mount) took it away.
            Some(Err(FsError::NotFound)) => Ok(None),
            Some(other) => Err(violation(
                "VIEW",
                "a directory vanished",
                format!("mount {m}: directory {dir} looks up as {other:?}"),
            )),
        }
    }

    /// The inode of the file at `path` on mount `m`, or `None` (the step is skipped; if the
    /// file is gone from the mount, the model follows).
    fn file_ino(&mut self, m: usize, path: &str) -> Check<Option<Ino>> {
        if self.parent(m, path)?.is_none() {
            return Ok(None);
        }
        match self.lookup(m, path)? {
            None => Ok(None),
            Some(Ok(a)) if a.kind == Kind::File => Ok(Some(a.ino)),
            Some(Ok(_)) => Err(violation(
                "VIEW",
                "a file shows as a directory",
                format!("mount {m}: {path} shows as a directory"),
            )),
            Some(Err(_)) => {
                self.note(
                    Some(m),
                    format!("{path} is gone from the mount (another writer removed it)"),
                );
                self.orphan(m, path);
                Ok(None)
            }
        }
    }

    /// The user was told `file` is saved: what the mount shows now is the acknowledged
    /// version, which must be a version of the name with the user's edits applied.
    fn acked(&mut self, m: usize, file: FileId) -> Check {
        let f = self.mounts[m].model.file(file).clone();
        let (base, edits) = self.mounts[m]
            .edits
            .remove(&file)
            .unwrap_or_else(|| (f.current.clone(), Vec::new()));
        let Some(path) = f.path.clone() else {
            // Gone from the view (another writer removed or replaced its name), yet saved
            // through a descriptor: that state is owed from here on, wherever the mount keeps
            // it (a conflict copy), instead of the one saved before.
            let mount = &mut self.mounts[m];
            mount.acked_ever.insert(digest(&f.current));
            if let Some((_, o)) = mount.orphans.iter_mut().find(|(id, _)| *id == file) {
                o.acked = Some(f.current.clone());
                o.maybe.clear();
                o.current = f.current.clone();
            }
            return Ok(());
        };
        let p = path.clone();
        let seen = self.alone(m, |fs| async move { look(fs, &p).await })?;
        let predicted = f.current.clone();
        let got = match seen {
            Seen::File(d, g) => {
                self.mounts[m].seen.insert((path.clone(), g));
                d
            }
            other => {
                self.note(
                    Some(m),
                    format!("  (after the acknowledgement {path} reads {other}; taken as written)"),
                );
                predicted.clone()
            }
        };
        let theirs = got != predicted
            && self.bucket.gens.iter().any(|((k, _), g)| {
                *k == path && g.owner != Party::Mount(m) && g.digest == digest(&got)
            });
        if theirs {
            // The mount shows another writer's generation after the save: the user's version
            // was set aside (a conflict copy, if all is well) and is owed as it was written.
            self.note(
                Some(m),
                format!(
                    "  (after the save {path} shows another writer's {}; the user's {} is owed)",
                    show(&got),
                    show(&predicted)
                ),
            );
            let held = self.mounts[m].handles.iter().any(|h| h.file == file);
            let mount = &mut self.mounts[m];
            mount.model.ack(file);
            mount.acked_ever.insert(digest(&predicted));
            if held {
                // Descriptors still open go on writing the user's file, which the mount now
                // keeps apart from the name (its later saves go beside, as its conflict copy);
                // the name is another writer's file from here on.
                self.orphan(m, &path);
                let mount = &mut self.mounts[m];
                mount.model.add(&path, got, true);
                mount.remember();
                return Ok(());
            }
            mount.model.set_current(file, got);
            mount.remember();
            return Ok(());
        }
        if got != predicted {
            let mut bases: Vec<Vec<u8>> = vec![Vec::new(), base];
            bases.extend(f.acked.iter().cloned());
            bases.extend(f.maybe.iter().cloned());
            if let Some(list) = self.bucket.bytes_under.get(&path) {
                bases.extend(list.iter().map(|b| b.to_vec()));
            }
            if !bases.iter().any(|b| apply(b, &edits) == got) {
                // Where the bytes before the user's first change came from, if from a generation.
                let first = edits
                    .iter()
                    .map(|e| match e {
                        Edit::Write(o, _) | Edit::Truncate(o) => *o,
                    })
                    .min()
                    .unwrap_or(0)
                    .min(got.len());
                let source = self
                    .bucket
                    .gen_bytes
                    .iter()
                    .filter(|(_, b)| first > 0 && b.len() >= first && b[..first] == got[..first])
                    .map(|((k, g), _)| format!("{k}#{g}"))
                    .collect::<Vec<_>>();
                let mixed = violation(
                    "VIEW",
                    "after a close the file shows no version with the user's writes",
                    format!(
                        "mount {m}: {path} reads {} after it was saved; the user's edits on the \
                         version it opened give {}, and on no version of {path} give what it \
                         shows (its first {first} bytes, before the user's changes, are those of \
                         {source:?})",
                        show(&got),
                        show(&predicted)
                    ),
                );
                self.soft(Err(mixed))?;
                // Passed over (SIM_ALLOW=VIEW): the user's version is owed as written, and the
                // bytes shown must never reach the bucket.
                let mount = &mut self.mounts[m];
                mount.model.ack(file);
                mount.acked_ever.insert(digest(&predicted));
                mount.mixed.insert(digest(&got));
                mount.model.set_current(file, got);
                mount.remember();
                return Ok(());
            }
            self.note(
                Some(m),
                format!(
                    "  (the mount based the edit on another version: {path} holds {})",
                    show(&got)
                ),
            );
        }
        let mount = &mut self.mounts[m];
        mount.model.set_current(file, got.clone());
        mount.model.ack(file);
        mount.acked_ever.insert(digest(&got));
        mount.remember();
        Ok(())
    }

    /// The user was told the save failed; the version may be committed nonetheless.
    fn maybe(&mut self, m: usize, file: FileId) {
        let mount = &mut self.mounts[m];
        mount.model.maybe(file);
        let d = digest(&mount.model.file(file).current);
        mount.acked_ever.insert(d);
    }

    fn write(&mut self, m: usize, fh: u64, file: FileId, offset: usize, data: &[u8]) -> Check {
        let d = data.to_vec();
        let r = self.run(m, |fs| async move { fs.write(fh, offset as u64, &d).await })?;
        match r {
            Ok(n) if n as usize == data.len() => {
                self.mounts[m].edit(file, Edit::Write(offset, data.to_vec()));
                self.mounts[m].model.write(file, offset, data);
                self.mounts[m].remember();
                Ok(())
            }
            other => Err(violation(
                "I5",
                "a local write failed",
                format!(
                    "mount {m}: write of {} bytes at {offset} failed: {other:?}",
                    data.len()
                ),
            )),
        }
    }

    fn close(&mut self, m: usize, h: Handle) -> Check<FsResult<()>> {
        let fh = h.fh;
        let name = self.handle_name(m, &h);
        self.doing(m, format!("close {name}"));
        let r = self.run(m, |fs| async move {
            let r = fs.flush(fh).await;
            fs.release(fh).await;
            r
        })?;
        match &r {
            Ok(()) => {
                self.mounts[m].told_stale.remove(&h.file);
                self.acked(m, h.file)?
            }
            Err(e) => {
                if *e == FsError::Stale {
                    self.mounts[m].told_stale.insert(h.file);
                }
                self.maybe(m, h.file)
            }
        }
        Ok(r)
    }

    fn keep_or_close(&mut self, m: usize, h: Handle, what: String) -> Check {
        if self.mounts[m].handles.len() < MAX_HANDLES && self.rng.gen_bool(0.3) {
            self.note(Some(m), format!("{what}; kept open as fh {}", h.fh));
            self.mounts[m].handles.push(h);
        } else {
            let r = self.close(m, h)?;
            self.note(Some(m), format!("{what}; close -> {}", outcome(&r)));
        }
        Ok(())
    }

    // -- steps ---------------------------------------------------------------------------------

    fn choose(&mut self, m: usize) -> Step {
        let h = !self.mounts[m].handles.is_empty();
        let w = |on: bool, n: u32| if on { n } else { 0 };
        let table = [
            (10, Step::Create),
            (8, Step::OpenWrite),
            (3, Step::Append),
            (4, Step::Rewrite),
            (w(h, 6), Step::HandleWrite),
            (w(h, 6), Step::HandleClose),
            (w(h, 3), Step::HandleFsync),
            (4, Step::Truncate),
            (5, Step::Rename),
            (2, Step::RenameDir),
            (5, Step::Unlink),
            (4, Step::Save),
            (8, Step::Read),
            (2, Step::Crash),
            (6, Step::Sleep),
        ];
        let total: u32 = table.iter().map(|(n, _)| n).sum();
        let mut x = self.rng.gen_range(0..total);
        for (n, k) in table {
            if x < n {
                return k;
            }
            x -= n;
        }
        Step::Sleep
    }

    fn one_step(&mut self) -> Check {
        let roll = self.rng.gen_range(0..100);
        if roll < 15 {
            self.op_outside();
        } else if roll < 17 {
            self.faults_on = !self.faults_on;
            self.apply_faults();
            let on = if self.faults_on { "on" } else { "off" };
            self.note(None, format!("faults {on}"));
        } else {
            let m = self.rng.gen_range(0..self.mounts.len());
            let kind = self.choose(m);
            self.doing = format!("[mount {m}.{}] {kind:?}", self.mounts[m].incarnation);
            self.bucket.ctx = format!("{kind:?} step").to_lowercase();
            let done = match kind {
                Step::Create => self.op_create(m)?,
                Step::OpenWrite => self.op_open_write(m, false)?,
                Step::Append => self.op_open_write(m, true)?,
                Step::Rewrite => self.op_rewrite(m)?,
                Step::HandleWrite => self.op_handle_write(m)?,
                Step::HandleClose => self.op_handle_close(m)?,
                Step::HandleFsync => self.op_handle_fsync(m)?,
                Step::Truncate => self.op_truncate(m)?,
                Step::Rename => self.op_rename(m)?,
                Step::RenameDir => self.op_rename_dir(m)?,
                Step::Unlink => self.op_unlink(m)?,
                Step::Save => self.op_save(m)?,
                Step::Read => self.op_read(m)?,
                Step::Crash => {
                    self.op_crash(m)?;
                    true
                }
                Step::Sleep => false,
            };
            if !done {
                let ms = self.rng.gen_range(0..1000);
                self.run(m, |_| async move {
                    tokio::time::sleep(Duration::from_millis(ms)).await
                })?;
                self.note(Some(m), format!("sleep {ms}ms"));
            }
            for mount in &mut self.mounts {
                let held: BTreeSet<FileId> = mount.handles.iter().map(|h| h.file).collect();
                mount.model.gc(&held);
            }
        }
        Ok(())
    }

    /// The outside writer: a put (new or replacing) or a delete, straight on the bucket.
    fn op_outside(&mut self) {
        let name = NAMES[self.rng.gen_range(0..NAMES.len())];
        let exists = self.store.object_bytes(name).is_some();
        if exists && self.rng.gen_bool(0.4) {
            self.store.remove(name);
            scan(&mut self.bucket, &self.mounts, &self.store, Party::Outside);
            self.note(None, format!("outside writer deletes {name}"));
        } else {
            let len = self.size();
            let data = self.bytes(len);
            self.store.insert(name, data.clone());
            scan(&mut self.bucket, &self.mounts, &self.store, Party::Outside);
            let what = if exists { "replaces" } else { "creates" };
            self.note(
                None,
                format!("outside writer {what} {name} with {}", show(&data)),
            );
        }
    }

    fn op_create(&mut self, m: usize) -> Check<bool> {
        let free: Vec<String> = NAMES
            .iter()
            .filter(|p| self.mounts[m].model.live(p).is_none())
            .map(|p| p.to_string())
            .collect();
        let Some(path) = self.pick(&free) else {
            return Ok(false);
        };
        self.create_at(m, &path, true).map(|_| true)
    }

    /// Creates (or empties, as `>` does) `path` on mount `m` and writes new content; the
    /// file's id when it was made.
    fn create_at(&mut self, m: usize, path: &str, may_keep: bool) -> Check<Option<FileId>> {
        let Some((parent, name)) = self.parent(m, path)? else {
            return Ok(None);
        };
        let Some(found) = self.lookup(m, path)? else {
            return Ok(None);
        };
        let over = if found.is_ok() { " (over a file)" } else { "" };
        let len = self.size();
        let data = self.bytes(len);
        self.doing(m, format!("create {path}{over}"));
        let r = self.run(m, |fs| async move { fs.create(parent, &name).await })?;
        let opened = match r {
            Ok((_, o)) => o,
            Err(e) => {
                self.note(Some(m), format!("create {path}{over} -> error: {e}"));
                return Ok(None);
            }
        };
        if self.mounts[m].model.live(path).is_some() {
            // The name held a file the user knew: `>` empties it, one file all along.
            let id = self.mounts[m].model.live(path).expect("live");
            self.mounts[m].edit(id, Edit::Truncate(0));
            self.mounts[m].model.set_current(id, Vec::new());
        } else {
            self.mounts[m].model.add(path, Vec::new(), false);
        }
        let id = self.mounts[m].model.live(path).expect("just made");
        self.write(m, opened.fh, id, 0, &data)?;
        let h = Handle {
            fh: opened.fh,
            file: id,
        };
        let what = format!("create {path}{over}, write {}", show(&data));
        if may_keep {
            self.keep_or_close(m, h, what)?;
        } else {
            let r = self.close(m, h)?;
            self.note(Some(m), format!("{what}; close -> {}", outcome(&r)));
            if r.is_err() {
                return Ok(None);
            }
        }
        Ok(Some(id))
    }

    fn op_open_write(&mut self, m: usize, append: bool) -> Check<bool> {
        let Some(path) = self.pick_live(m) else {
            return Ok(false);
        };
        let Some(ino) = self.file_ino(m, &path)? else {
            return Ok(true);
        };
        let Some(id) = self.mounts[m].model.live(&path) else {
            return Ok(true);
        };
        let base = self.mounts[m].model.file(id).current.clone();
        let offset = if append {
            base.len()
        } else {
            self.offset_for(base.len())
        };
        let len = self.size().max(1);
        let data = self.bytes(len);
        let what = format!(
            "open {path} for writing, pwrite {} at {offset}{}",
            show(&data),
            if append { " (append)" } else { "" }
        );
        self.doing(m, what.clone());
        let r = self.run(m, |fs| fs.open(ino, W))?;
        let opened = match r {
            Ok(o) => o,
            Err(e) => {
                self.note(Some(m), format!("{what}: open -> error: {e}"));
                return Ok(true);
            }
        };
        self.write(m, opened.fh, id, offset, &data)?;
        let h = Handle {
            fh: opened.fh,
            file: id,
        };
        self.keep_or_close(m, h, what)?;
        Ok(true)
    }

    fn op_rewrite(&mut self, m: usize) -> Check<bool> {
        let Some(path) = self.pick_live(m) else {
            return Ok(false);
        };
        let Some(ino) = self.file_ino(m, &path)? else {
            return Ok(true);
        };
        let Some(id) = self.mounts[m].model.live(&path) else {
            return Ok(true);
        };
        let len = self.size();
        let data = self.bytes(len);
        let what = format!("open {path} with O_TRUNC, write {}", show(&data));
        self.doing(m, what.clone());
        let r = self.run(m, |fs| fs.open(ino, WT))?;
        let opened = match r {
            Ok(o) => o,
            Err(e) => {
                self.note(Some(m), format!("{what}: open -> error: {e}"));
                return Ok(true);
            }
        };
        self.mounts[m].edit(id, Edit::Truncate(0));
        self.mounts[m].model.set_current(id, Vec::new());
        self.write(m, opened.fh, id, 0, &data)?;
        let h = Handle {
            fh: opened.fh,
            file: id,
        };
        self.keep_or_close(m, h, what)?;
        Ok(true)
    }

    fn pick_handle(&mut self, m: usize) -> Option<usize> {
        let n = self.mounts[m].handles.len();
        (n > 0).then(|| self.rng.gen_range(0..n))
    }

    fn handle_name(&self, m: usize, h: &Handle) -> String {
        match self.mounts[m]
            .model
            .files
            .get(&h.file)
            .and_then(|f| f.path.clone())
        {
            Some(p) => format!("fh {} ({p})", h.fh),
            None => format!("fh {} (gone from the view)", h.fh),
        }
    }

    fn op_handle_write(&mut self, m: usize) -> Check<bool> {
        let Some(i) = self.pick_handle(m) else {
            return Ok(false);
        };
        let h = self.mounts[m].handles[i].clone();
        let size = self.mounts[m].model.file(h.file).current.len();
        let offset = self.offset_for(size);
        let len = self.size().max(1);
        let data = self.bytes(len);
        self.write(m, h.fh, h.file, offset, &data)?;
        let name = self.handle_name(m, &h);
        self.note(
            Some(m),
            format!("pwrite {name} {} at {offset}", show(&data)),
        );
        Ok(true)
    }

    fn op_handle_close(&mut self, m: usize) -> Check<bool> {
        let Some(i) = self.pick_handle(m) else {
            return Ok(false);
        };
        let h = self.mounts[m].handles.remove(i);
        let name = self.handle_name(m, &h);
        let r = self.close(m, h)?;
        self.note(Some(m), format!("close {name} -> {}", outcome(&r)));
        Ok(true)
    }

    fn op_handle_fsync(&mut self, m: usize) -> Check<bool> {
        let Some(i) = self.pick_handle(m) else {
            return Ok(false);
        };
        let h = self.mounts[m].handles[i].clone();
        let name = self.handle_name(m, &h);
        let fh = h.fh;
        self.doing(m, format!("fsync {name}"));
        let r = self.run(m, |fs| fs.fsync(fh))?;
        self.note(Some(m), format!("fsync {name} -> {}", outcome(&r)));
        match r {
            Ok(()) => self.acked(m, h.file)?,
            Err(_) => self.maybe(m, h.file),
        }
        Ok(true)
    }

    fn op_truncate(&mut self, m: usize) -> Check<bool> {
        let Some(path) = self.pick_live(m) else {
            return Ok(false);
        };
        let Some(ino) = self.file_ino(m, &path)? else {
            return Ok(true);
        };
        let Some(id) = self.mounts[m].model.live(&path) else {
            return Ok(true);
        };
        let base = self.mounts[m].model.file(id).current.clone();
        let len = match self.rng.gen_range(0..3) {
            0 => 0,
            1 => base.len() + self.rng.gen_range(1..10_000),
            _ => self.rng.gen_range(0..=base.len()),
        };
        self.doing(m, format!("truncate {path} to {len}"));
        let r = self.run(m, |fs| fs.setattr(ino, Some(len as u64), None, None))?;
        self.note(
            Some(m),
            format!("truncate {path} to {len} -> {}", outcome(&r)),
        );
        match r {
            Ok(_) => {
                self.mounts[m].edit(id, Edit::Truncate(len));
                self.mounts[m].model.truncate(id, len);
                self.acked(m, id)?;
            }
            Err(_) => {
                self.mounts[m].model.truncate(id, len);
                self.maybe(m, id);
                self.mounts[m].model.set_current(id, base);
            }
        }
        Ok(true)
    }

    fn op_rename(&mut self, m: usize) -> Check<bool> {
        let Some(from) = self.pick_live(m) else {
            return Ok(false);
        };
        let targets: Vec<String> = NAMES
            .iter()
            .filter(|p| **p != from)
            .map(|p| p.to_string())
            .collect();
        let Some(to) = self.pick(&targets) else {
            return Ok(false);
        };
        self.rename(m, &from, &to).map(|_| true)
    }

    /// `mv from to` on mount `m`: the lookups the kernel makes, then the rename.
    fn rename(&mut self, m: usize, from: &str, to: &str) -> Check<bool> {
        if self.file_ino(m, from)?.is_none() {
            return Ok(false);
        }
        let Some((p1, n1)) = self.parent(m, from)? else {
            return Ok(false);
        };
        let Some((p2, n2)) = self.parent(m, to)? else {
            return Ok(false);
        };
        let Some(found) = self.lookup(m, to)? else {
            return Ok(false);
        };
        let moved = self.mounts[m].model.live(from);
        let over = if found.is_ok() { " (over a file)" } else { "" };
        self.may_land_at(m, from, to);
        self.doing(m, format!("rename {from} -> {to}{over}"));
        let r = self.run(m, |fs| async move { fs.rename(p1, &n1, p2, &n2).await })?;
        if let Some(id) = moved {
            self.maybe(m, id);
        }
        self.note(
            Some(m),
            format!("rename {from} -> {to}{over} -> {}", outcome(&r)),
        );
        let happened = match &r {
            Ok(()) => true,
            Err(_) => match moved {
                Some(id) => self.moved_nonetheless(m, id, from, to)?,
                None => false,
            },
        };
        if let Some(id) = moved.filter(|_| happened) {
            self.moved_to(m, id, from, to)?;
        }
        Ok(happened)
    }

    /// `mv d1 d2` (or back) on mount `m`: every object under the directory moves, whoever
    /// wrote it, and the other mounts and the outside writer may be writing under either name.
    /// A failed rename may leave some files under each name (a delete that failed may still
    /// land, so copies are never taken back after one): each of this mount's files follows to
    /// the new name only if it is gone from the old one and shows there.
    fn op_rename_dir(&mut self, m: usize) -> Check<bool> {
        let (from, to) = if self.rng.gen_bool(0.5) {
            ("d1", "d2")
        } else {
            ("d2", "d1")
        };
        match self.lookup(m, from)? {
            Some(Ok(a)) if a.kind == Kind::Dir => {}
            _ => return Ok(false),
        }
        if self.lookup(m, to)?.is_none() {
            return Ok(false);
        }
        let prefix = format!("{from}/");
        // The kernel knows the files it shows; one already gone from the view (its save went
        // beside another writer's change, say) is not moved with the directory.
        let shown: Vec<String> = self.mounts[m]
            .model
            .names
            .keys()
            .filter(|p| p.starts_with(&prefix))
            .cloned()
            .collect();
        for p in &shown {
            self.file_ino(m, p)?;
        }
        // The rename's listing sees what is under the directory now (or less): those are the
        // generations it may delete, as the user asked for the whole directory to move.
        let mut mv = Moving {
            mount: m,
            from: prefix.clone(),
            to: format!("{to}/"),
            had: HashSet::new(),
            seen: HashSet::new(),
        };
        for (key, generation, data) in self.store.objects() {
            if let Some(rest) = key.strip_prefix(&prefix) {
                mv.had.insert((rest.to_string(), digest(&data)));
                mv.seen.insert((key, generation));
            }
        }
        self.bucket.moving = Some(mv);
        let moved: Vec<(String, String, FileId)> = self.mounts[m]
            .model
            .names
            .iter()
            .filter(|(p, _)| p.starts_with(&prefix))
            .map(|(p, id)| (p.clone(), format!("{to}/{}", &p[prefix.len()..]), *id))
            .collect();
        for (path, dest, _) in &moved {
            self.may_land_at(m, path, dest);
        }
        self.doing(m, format!("rename directory {from} -> {to}"));
        let r = self.run(m, |fs| async move {
            fs.rename(ROOT_INO, from, ROOT_INO, to).await
        });
        self.bucket.moving = None;
        let r = r?;
        for (_, _, id) in &moved {
            self.maybe(m, *id);
        }
        let holding: Vec<&str> = moved.iter().map(|(p, _, _)| p.as_str()).collect();
        self.note(
            Some(m),
            format!(
                "rename directory {from} -> {to} (this mount's files {holding:?}) -> {}",
                outcome(&r)
            ),
        );
        match r {
            Ok(()) => {
                for (path, dest, id) in &moved {
                    self.moved_to(m, *id, path, dest)?;
                }
            }
            Err(_) => {
                for (path, dest, id) in &moved {
                    if self.moved_nonetheless(m, *id, path, dest)? {
                        self.renamed(m, path, dest);
                    }
                }
            }
        }
        Ok(true)
    }

    /// The rename of mount `m`'s file from `from` to `to` may upload it under its new name
    /// before it returns: what was under the old name may land under the new one.
    fn may_land_at(&mut self, m: usize, from: &str, to: &str) {
        let history = &mut self.mounts[m].model.history;
        let old = history.get(from).cloned().unwrap_or_default();
        history.entry(to.to_string()).or_default().extend(old);
    }

    /// After a rename of mount `m`'s file `id` from `from` to `to` failed: whether it happened
    /// nonetheless (the old name is gone and the new one shows the file).
    fn moved_nonetheless(&mut self, m: usize, id: FileId, from: &str, to: &str) -> Check<bool> {
        let (f, t) = (from.to_string(), to.to_string());
        let (a, b) = self.alone(
            m,
            |fs| async move { (look(fs, &f).await, look(fs, &t).await) },
        )?;
        let happened =
            a == Seen::Missing && matches!(&b, Seen::File(d, _) if self.is_or_may_be(m, id, d));
        if let (true, Seen::File(d, _)) = (happened, &b) {
            self.mounts[m].model.set_current(id, d.clone());
        }
        if happened {
            self.note(Some(m), format!("  ({from} moved to {to} nonetheless)"));
        }
        Ok(happened)
    }

    /// Whether `d` is mount `m`'s file `id` as the model has it, or a state of it that a crash
    /// or a failed save may have kept instead (`maybe` in the model).
    fn is_or_may_be(&self, m: usize, id: FileId, d: &[u8]) -> bool {
        let f = self.mounts[m].model.file(id);
        f.current == d || f.maybe.iter().any(|x| x == d)
    }

    /// A rename of mount `m`'s file `id` from `from` to `to` succeeded. Where another writer's
    /// object was at `to`, unseen, the file went beside it as a conflict copy and is owed
    /// there, and the name shows theirs; else the file is at `to`.
    fn moved_to(&mut self, m: usize, id: FileId, from: &str, to: &str) -> Check {
        let t = to.to_string();
        let shown = self.alone(m, |fs| async move { look(fs, &t).await })?;
        let current = self.mounts[m].model.file(id).current.clone();
        // A generation another party made, or bytes another party wrote first (this mount's
        // rename copy of them is still theirs).
        let theirs = |d: &[u8], g: &i64| {
            let other = |p: &Party| *p != Party::Mount(m);
            self.bucket
                .gens
                .get(&(to.to_string(), *g))
                .is_some_and(|gen| other(&gen.owner))
                || self.bucket.author.get(&digest(d)).is_some_and(other)
        };
        // Another writer removed what this mount saw at `to` (the rename treats that as a
        // conflict too, and the name stays empty), or removed the file at `from` since the
        // mount last looked (its stat cache still showed it; nothing was there to move).
        let by_others = |name: &str| {
            self.bucket
                .touched
                .get(name)
                .is_some_and(|t| t.iter().any(|p| *p != Party::Mount(m)))
        };
        let removed = matches!(shown, Seen::Missing) && (by_others(to) || by_others(from));
        match &shown {
            Seen::File(d, _) if *d == current => self.renamed(m, from, to),
            Seen::File(d, _) if self.is_or_may_be(m, id, d) => {
                // A later state than the last saved one, which a crash or a failed save may
                // have kept (a rename of a file open for writing saves it as it is).
                self.note(
                    Some(m),
                    format!("  ({to} shows the file's later state {})", show(d)),
                );
                self.mounts[m].model.set_current(id, d.clone());
                self.renamed(m, from, to);
            }
            Seen::File(d, g) if theirs(d, g) => self.went_beside(m, from, to, &shown),
            Seen::Missing if removed => self.went_beside(m, from, to, &shown),
            _ => {
                return Err(violation(
                    "VIEW",
                    "a renamed file shows neither itself nor another writer's file",
                    format!(
                        "mount {m}: after renaming {from} ({}) to {to}, {to} shows {shown}",
                        show(&current)
                    ),
                ))
            }
        }
        Ok(())
    }

    /// A rename of mount `m`'s file from `from` to `to` went beside what another writer left
    /// at `to` (the user's file there, if any, is replaced all the same, as a rename over it).
    fn went_beside(&mut self, m: usize, from: &str, to: &str, shown: &Seen) {
        self.note(
            Some(m),
            format!("  ({from} went beside {to}, which shows {shown})"),
        );
        self.orphan(m, from);
        self.mounts[m].model.detach(to);
    }

    /// Mount `m`'s file at `from` is now at `to`. Who touched `from` follows it: a save of the
    /// file may go beside the object at `to` as a conflict copy because another writer changed
    /// it under its old name.
    fn renamed(&mut self, m: usize, from: &str, to: &str) {
        self.mounts[m].model.rename(from, to);
        if let Some(t) = self.bucket.touched.get(from).cloned() {
            self.bucket
                .touched
                .entry(to.to_string())
                .or_default()
                .extend(t);
        }
    }

    fn op_unlink(&mut self, m: usize) -> Check<bool> {
        let Some(path) = self.pick_live(m) else {
            return Ok(false);
        };
        if self.file_ino(m, &path)?.is_none() {
            return Ok(true);
        }
        let Some((parent, name)) = self.parent(m, &path)? else {
            return Ok(true);
        };
        self.doing(m, format!("unlink {path}"));
        let r = self.run(m, |fs| async move { fs.unlink(parent, &name).await })?;
        self.note(Some(m), format!("unlink {path} -> {}", outcome(&r)));
        match r {
            Ok(()) => self.mounts[m].model.unlink(&path),
            Err(FsError::NotFound) => self.orphan(m, &path),
            Err(_) => {
                let p = path.clone();
                if self.alone(m, |fs| async move { look(fs, &p).await })? == Seen::Missing {
                    self.note(Some(m), "  (the unlink happened nonetheless)".into());
                    self.mounts[m].model.unlink(&path);
                }
            }
        }
        Ok(true)
    }

    /// An editor's save: write a temporary file, close it, rename it over the name.
    fn op_save(&mut self, m: usize) -> Check<bool> {
        let path = NAMES[self.rng.gen_range(0..NAMES.len())].to_string();
        let tmp = temp_of(&path);
        if self.mounts[m].model.live(&tmp).is_some() {
            return Ok(false);
        }
        self.note(Some(m), format!("save {path} (through {tmp}):"));
        if self.create_at(m, &tmp, false)?.is_none() {
            return Ok(true);
        }
        self.rename(m, &tmp, &path)?;
        Ok(true)
    }

    fn op_read(&mut self, m: usize) -> Check<bool> {
        let Some(path) = self.pick_live(m) else {
            return Ok(false);
        };
        let p = path.clone();
        let seen = self.run(m, |fs| async move { look(fs, &p).await })?;
        self.note(Some(m), format!("read {path} -> {seen}"));
        let Some(id) = self.mounts[m].model.live(&path) else {
            return Ok(true);
        };
        match seen {
            Seen::File(d, g) => {
                self.mounts[m].seen.insert((path.clone(), g));
                if d != self.mounts[m].model.file(id).current {
                    let dg = digest(&d);
                    if !self.bucket.all.contains(&dg) && !self.mounts[m].wrote.contains(&dg) {
                        return Err(violation(
                            "VIEW",
                            "a read shows bytes nobody wrote",
                            format!(
                                "mount {m}: {path} reads {}, which no writer ever wrote; the \
                                 user's file is {}",
                                show(&d),
                                show(&self.mounts[m].model.file(id).current)
                            ),
                        ));
                    }
                    // Another writer's version under a file the user holds open: the mount put
                    // the user's file elsewhere (a rename over an unseen object went beside
                    // it), and its descriptors keep writing that file, which stays owed.
                    let held = self.mounts[m].handles.iter().any(|h| h.file == id);
                    if held && !self.mounts[m].wrote.contains(&dg) {
                        self.note(
                            Some(m),
                            format!(
                                "  ({path} shows another writer's version; the open file is \
                                 kept beside it)"
                            ),
                        );
                        self.orphan(m, &path);
                        self.mounts[m].model.add(&path, d, false);
                        self.mounts[m].remember();
                        return Ok(true);
                    }
                    // Another writer's version, or one the mount took instead of the user's:
                    // the user sees it from here on.
                    self.mounts[m].model.set_current(id, d);
                    self.mounts[m].edits.remove(&id);
                    self.mounts[m].remember();
                }
            }
            Seen::Missing => {
                self.note(Some(m), format!("  ({path} is gone from the mount)"));
                self.orphan(m, &path);
            }
            Seen::Failed(_) if self.faulty() => {}
            // The mount still holds the replaced generation's attributes (the stat cache).
            Seen::Failed(FsError::Stale) => {}
            Seen::Failed(_) if self.mounts[m].told_stale.contains(&id) => {
                self.note(
                    Some(m),
                    format!(
                        "  ({path}: its unsaved changes lack bytes of a generation that is gone)"
                    ),
                );
            }
            Seen::Failed(e) => {
                return Err(violation(
                    "VIEW",
                    "a read failed with a healthy bucket",
                    format!("mount {m}: reading {path} failed: {e}"),
                ))
            }
            Seen::Dir => {
                return Err(violation(
                    "VIEW",
                    "a file shows as a directory",
                    format!("mount {m}: {path} reads as a directory"),
                ))
            }
        }
        Ok(true)
    }

    /// Lets uploads run a while, then drops mount `m` mid-flight and mounts it again on its
    /// cache directory; the other mounts go on.
    fn op_crash(&mut self, m: usize) -> Check {
        let ms = if self.rng.gen_bool(0.2) {
            0
        } else {
            self.rng.gen_range(0..300)
        };
        self.run(m, |_| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await
        })?;
        let n = self.mounts[m].handles.len();
        self.note(
            Some(m),
            format!("CRASH after {ms}ms more ({n} handles open)"),
        );
        let mount = &mut self.mounts[m];
        mount.rt = None;
        mount.fs = None;
        mount.handles.clear();
        mount.model.gc(&BTreeSet::new());
        // What the user wrote and did not save may or may not come back; the mount shows the
        // last saved version or a later one.
        let ids: Vec<FileId> = mount.model.names.values().copied().collect();
        for id in ids {
            mount.model.maybe(id);
            let d = digest(&mount.model.file(id).current);
            mount.acked_ever.insert(d);
            if let Some(acked) = mount.model.file(id).acked.clone() {
                mount.model.files.get_mut(&id).expect("live").current = acked;
            }
        }
        mount.edits.clear();
        mount.incarnation += 1;
        self.mount(m)
    }

    /// Where I10-I12 (built elsewhere) attach: called after every step and after the final
    /// drain with the bucket's history and every mount's model.
    fn hooks(&mut self) -> Check {
        Ok(())
    }

    /// Faults stop; every handle is closed; every mount drains; then I9, I6, I7.
    fn finish(&mut self) -> Check {
        self.faults_on = false;
        self.apply_faults();
        self.note(None, "faults off; closing every handle".into());
        let mut stale: Vec<BTreeSet<FileId>> = Vec::new();
        for m in 0..self.mounts.len() {
            let mut mine = BTreeSet::new();
            for h in std::mem::take(&mut self.mounts[m].handles) {
                let name = self.handle_name(m, &h);
                let file = h.file;
                let r = self.close(m, h)?;
                self.note(Some(m), format!("close {name} -> {}", outcome(&r)));
                // Some of the file's bytes belong to a generation another writer replaced: the
                // changes stay staged, reported unsaved; the user was told.
                if let Err(FsError::Stale) = r {
                    mine.insert(file);
                    continue;
                }
                if let Err(e) = r {
                    return Err(violation(
                        "I6",
                        "close failed with a healthy bucket",
                        format!("mount {m}: close of {name} failed with no faults: {e}"),
                    ));
                }
            }
            self.mounts[m].model.gc(&BTreeSet::new());
            stale.push(mine);
        }
        self.doing = "the final drain".into();
        self.bucket.ctx = "final drain".into();
        // A drain of one mount can make work for another (a conflict it then sees): twice.
        for round in 0..2 {
            for m in 0..self.mounts.len() {
                let Sim {
                    mounts,
                    bucket,
                    store,
                    now,
                    ..
                } = self;
                let mounts: &[Mount] = mounts;
                let drained = drive(
                    mounts,
                    bucket,
                    store,
                    now,
                    m,
                    drain_bounded(mounts[m].fs()),
                    Duration::from_secs(1200),
                )?;
                let status = self.run(m, |fs| fs.write_status())?;
                self.note(
                    Some(m),
                    format!(
                        "drain (round {round}) -> {drained:?}; {}",
                        show_status(&status)
                    ),
                );
                match drained {
                    Err(e) => {
                        return Err(violation(
                            "I6",
                            "the final drain never finished",
                            format!("mount {m}: with a healthy bucket drain(false) is stuck: {e}"),
                        ))
                    }
                    Ok(n) if n as u64 > status.unsaved_files => {
                        return Err(violation(
                            "I6",
                            "the final drain left files pending",
                            format!(
                                "mount {m}: drain(false) left {n} pending, {} of them unsaved",
                                status.unsaved_files
                            ),
                        ))
                    }
                    // Changes that could not be saved are kept staged and reported as not
                    // saved (I9, I10).
                    Ok(_) => self.mounts[m].unsaved = status.unsaved_files + status.held_files,
                }
            }
        }
        for (m, files) in stale.iter().enumerate() {
            let kept = self.mounts[m].unsaved;
            if (files.len() as u64) > kept {
                let dropped = violation(
                    "I9",
                    "an edit whose base generation is gone was dropped, not kept staged",
                    format!(
                        "mount {m}: {} files' last changes could not be saved (their close said \
                         the object changed) but after the drain the mount reports {kept} \
                         unsaved: the changes were dropped",
                        files.len()
                    ),
                );
                self.soft(Err(dropped))?;
            }
        }
        let keys = self.store.keys();
        if let Some(k) = keys.iter().find(|k| k.starts_with(&format!("{TEMP_DIR}/"))) {
            return Err(violation(
                "I7",
                "temporary parts are left after the drain",
                format!("the bucket still holds {k}"),
            ));
        }
        let mut bad = Ok(());
        for (key, m, d) in &self.bucket.conflicts {
            if !self.mounts[*m].acked_ever.contains(d) {
                bad = Err(violation(
                    "I4",
                    "a conflict copy holds no version its mount acknowledged",
                    format!(
                        "mount {m} made conflict copy {key} holding {}, a state its user never \
                         saved (close, fsync) nor was told failed to save",
                        show_digest(*d)
                    ),
                ));
                break;
            }
        }
        self.soft(bad)?;
        let survivors = self.check_survivors();
        self.soft(survivors)?;
        self.hooks()?;
        self.note(None, "every acknowledged version is accounted for".into());
        Ok(())
    }

    /// I9: every version a mount acknowledged and did not itself supersede or remove is in the
    /// bucket under some name, unless a writer entitled to replaced or removed it.
    fn check_survivors(&mut self) -> Check {
        let present: HashSet<Digest> = self
            .store
            .objects()
            .iter()
            .filter(|(k, _, _)| !k.starts_with(&format!("{TEMP_DIR}/")))
            .map(|(_, _, b)| digest(b))
            .collect();
        for (m, mount) in self.mounts.iter().enumerate() {
            let mut missing = Vec::new();
            let owed = mount
                .model
                .files
                .values()
                .filter(|f| f.path.is_some())
                .chain(mount.orphans.iter().map(|(_, f)| f));
            for f in owed {
                let Some(acked) = &f.acked else { continue };
                let forms: Vec<Digest> = std::iter::once(acked)
                    .chain(f.maybe.iter())
                    .map(|d| digest(d))
                    .collect();
                if forms
                    .iter()
                    .any(|d| present.contains(d) || self.bucket.excused.contains(d))
                {
                    continue;
                }
                let name = f
                    .path
                    .clone()
                    .unwrap_or_else(|| "(gone from its view)".into());
                let how = forms
                    .iter()
                    .find_map(|d| self.bucket.destroyed_unseen.get(d).cloned());
                let uploaded = forms.iter().any(|d| self.bucket.all.contains(d));
                missing.push((format!("{name}: {}", show(acked)), how, uploaded));
            }
            if missing.is_empty() {
                continue;
            }
            let names: Vec<&str> = missing.iter().map(|(n, _, _)| n.as_str()).collect();
            if missing.len() as u64 <= mount.unsaved {
                self.log.push(format!(
                    "        mount {m} keeps {names:?} staged, reported unsaved"
                ));
                continue;
            }
            let (class, why) = match &missing[0] {
                (_, Some(how), _) => (
                    "an acknowledged version was destroyed by a mount that never saw it",
                    format!("; {how} without having seen it"),
                ),
                (_, None, true) => (
                    "an acknowledged version was uploaded, then lost",
                    String::new(),
                ),
                (_, None, false) => (
                    "an acknowledged version was never uploaded nor kept",
                    String::new(),
                ),
            };
            return Err(violation(
                "I9",
                class,
                format!(
                    "after the drain the bucket holds no copy of mount {m}'s acknowledged {}{why} \
                     (the mount reports {} unsaved)",
                    names.join(", "),
                    mount.unsaved
                ),
            ));
        }
        Ok(())
    }

    /// A violation that `SIM_ALLOW` names is recorded and passed over.
    fn soft(&mut self, r: Check) -> Check {
        match r {
            Err(v)
                if self.bucket.allow.contains(v.inv)
                    && !self
                        .bucket
                        .fatal
                        .as_ref()
                        .is_some_and(|f| v.class.contains(f.as_str())) =>
            {
                self.bucket.flag(v);
                Ok(())
            }
            r => r,
        }
    }

    /// Runs steps 1..=ops (only those in `keep`, if given: each step draws its choices from its
    /// own generator, so a step left out changes the others only through the state), then the
    /// final drain.
    fn run_all(&mut self, ops: usize, keep: Option<&BTreeSet<usize>>) -> Check {
        let r = (|| {
            for i in 1..=ops {
                if keep.is_some_and(|k| !k.contains(&i)) {
                    continue;
                }
                self.step = i;
                self.rng = StdRng::seed_from_u64(mix(self.seed, 0x57e9_0000 + i as u64));
                self.doing = "[outside]".into();
                self.bucket.ctx = "outside step".into();
                self.one_step()?;
                self.hooks()?;
            }
            self.step = ops + 1;
            self.doing = "the final drain".into();
            self.bucket.ctx = "final drain".into();
            self.finish()
        })();
        if r.is_err() {
            for l in std::mem::take(&mut self.bucket.lines) {
                self.log.push(format!("        {l}"));
            }
            self.log.push(format!(
                "#{:<3} {} FAILED here (t={}ms)",
                self.step,
                self.doing,
                self.now.as_millis()
            ));
        }
        r
    }
}

struct Failure {
    seed: u64,
    violation: Violation,
    /// The step that failed (one past the last for the final drain).
    step: usize,
    params: String,
    log: Vec<String>,
}

/// A seed's run: its log and the violations `SIM_ALLOW` passed over.
struct Passed {
    log: Vec<String>,
    tolerated: Vec<Violation>,
}

fn replay_command(seed: u64, keep: Option<&[usize]>) -> String {
    let keep = keep.map_or(String::new(), |k| {
        let list: Vec<String> = k.iter().map(|i| i.to_string()).collect();
        format!(" SIM_KEEP={}", list.join(","))
    });
    format!(
        "SIM_SEED={seed}{keep} cargo test -p fs-core --test sim sim_shared_seeds -- --nocapture \
         (SIM_LOG=info adds the core's log)"
    )
}

/// What a run is configured with besides its seed.
#[derive(Clone)]
struct RunCfg {
    mounts: usize,
    ops: usize,
    allow: BTreeSet<String>,
}

fn run_seed(
    seed: u64,
    cfg: &RunCfg,
    keep: Option<&BTreeSet<usize>>,
) -> Result<Passed, Box<Failure>> {
    let fail = |v: Violation| {
        Box::new(Failure {
            seed,
            violation: v,
            step: 0,
            params: String::new(),
            log: Vec::new(),
        })
    };
    let mut sim = match std::panic::catch_unwind(|| Sim::new(seed, cfg.mounts, &cfg.allow)) {
        Ok(Ok(sim)) => sim,
        Ok(Err(v)) => {
            fs_core::clock::set_thread_source(None);
            return Err(fail(v));
        }
        Err(p) => {
            fs_core::clock::set_thread_source(None);
            return Err(fail(violation("PANIC", "panic", panic_message(p))));
        }
    };
    let result =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.run_all(cfg.ops, keep)));
    let outcome = match result {
        Ok(r) => r,
        Err(p) => Err(violation("PANIC", "panic", panic_message(p))),
    };
    let params = sim.params.to_string();
    let mut log = std::mem::take(&mut sim.log);
    for l in std::mem::take(&mut sim.bucket.lines) {
        log.push(format!("        {l}"));
    }
    // Drop the runtimes before the filesystems, as a crash does.
    for m in &mut sim.mounts {
        m.rt = None;
    }
    fs_core::clock::set_thread_source(None);
    match outcome {
        Ok(()) => Ok(Passed {
            log,
            tolerated: std::mem::take(&mut sim.bucket.tolerated),
        }),
        Err(violation) => Err(Box::new(Failure {
            seed,
            violation,
            step: sim.step,
            params,
            log,
        })),
    }
}

fn describe(inv: &str) -> &'static str {
    match inv {
        "I8" => "I8 nobody else's bytes are destroyed",
        "I9" => "I9 every acknowledged version of every mount survives",
        other => super::describe(other),
    }
}

fn class_of(v: &Violation) -> String {
    format!("[{}] {}", v.inv, v.class)
}

/// The fewest steps of `seed` that still fail with the same invariant and class: a
/// delta-debugging pass over the steps up to the failing one.
fn reduce(seed: u64, cfg: &RunCfg, first: &Failure) -> (Vec<usize>, Failure) {
    let class = class_of(&first.violation);
    let last = first.step.min(cfg.ops);
    let mut keep: Vec<usize> = (1..=last).collect();
    let mut best = None;
    let fails = |steps: &[usize]| -> Option<Failure> {
        let set: BTreeSet<usize> = steps.iter().copied().collect();
        match run_seed(seed, cfg, Some(&set)) {
            Err(f) if class_of(&f.violation) == class => Some(*f),
            _ => None,
        }
    };
    let mut n = 2;
    while keep.len() >= 2 {
        let chunk = keep.len().div_ceil(n);
        let mut removed = false;
        for start in (0..keep.len()).step_by(chunk) {
            let candidate: Vec<usize> = keep[..start]
                .iter()
                .chain(keep[(start + chunk).min(keep.len())..].iter())
                .copied()
                .collect();
            if let Some(f) = fails(&candidate) {
                keep = candidate;
                best = Some(f);
                n = (n - 1).max(2);
                removed = true;
                break;
            }
        }
        if !removed {
            if n >= keep.len() {
                break;
            }
            n = (2 * n).min(keep.len());
        }
    }
    let best = best.or_else(|| fails(&keep)).unwrap_or(Failure {
        seed,
        violation: first.violation.clone(),
        step: first.step,
        params: first.params.clone(),
        log: first.log.clone(),
    });
    (keep, best)
}

fn report(f: &Failure, keep: Option<&[usize]>) -> String {
    let mut msg = format!(
        "sim shared seed {} FAILED\n  violated: {}\n  {}: {}\n  replay: {}\n  params: {}\n  \
         op log:\n",
        f.seed,
        describe(f.violation.inv),
        f.violation.class,
        f.violation.detail,
        replay_command(f.seed, keep),
        f.params
    );
    for line in &f.log {
        msg.push_str("    ");
        msg.push_str(line);
        msg.push('\n');
    }
    msg
}

/// The multi-mount simulation over seeds 0..SIM_SEEDS (or SIM_SEED alone; with SIM_KEEP=a,b,c
/// only those steps of it; with SIM_REDUCE=1 a failing SIM_SEED is reduced to its fewest
/// steps).
#[test]
fn sim_shared_seeds() {
    let cfg = RunCfg {
        ops: env_num("SIM_OPS", 60) as usize,
        mounts: env_num("SIM_MOUNTS", 2).clamp(2, 3) as usize,
        allow: std::env::var("SIM_ALLOW")
            .unwrap_or_default()
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
    };
    let single = std::env::var("SIM_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok());
    let keep: Option<BTreeSet<usize>> = std::env::var("SIM_KEEP")
        .ok()
        .map(|k| k.split(',').filter_map(|s| s.trim().parse().ok()).collect());
    let seeds: Vec<u64> = match single {
        Some(s) => vec![s],
        None => (0..env_num("SIM_SEEDS", 40)).collect(),
    };
    let verbose = std::env::var("SIM_VERBOSE").is_ok_and(|v| v != "0");
    let start = std::time::Instant::now();
    let mut failures = Vec::new();
    let mut tolerated: Vec<(u64, Violation)> = Vec::new();
    for &seed in &seeds {
        let keep = if single.is_some() {
            keep.as_ref()
        } else {
            None
        };
        match run_seed(seed, &cfg, keep) {
            Ok(p) => {
                if single.is_some() {
                    eprintln!(
                        "sim shared seed {seed} passed; op log:\n    {}",
                        p.log.join("\n    ")
                    );
                }
                tolerated.extend(p.tolerated.into_iter().map(|v| (seed, v)));
            }
            Err(f) => {
                eprintln!(
                    "seed {} [{}] {}: {}",
                    f.seed, f.violation.inv, f.violation.class, f.violation.detail
                );
                failures.push(f);
            }
        }
    }
    eprintln!(
        "sim shared: {} seeds x {} ops x {} mounts in {:.1}s, {} failed, {} allowed violations",
        seeds.len(),
        cfg.ops,
        cfg.mounts,
        start.elapsed().as_secs_f64(),
        failures.len(),
        tolerated.len()
    );
    let mut classes: Vec<(String, Vec<u64>)> = Vec::new();
    let mut add = |class: String, seed: u64| match classes.iter_mut().find(|(c, _)| *c == class) {
        Some((_, s)) => {
            if s.last() != Some(&seed) {
                s.push(seed)
            }
        }
        None => classes.push((class, vec![seed])),
    };
    for (seed, v) in &tolerated {
        add(format!("{} (allowed)", class_of(v)), *seed);
    }
    for f in &failures {
        add(class_of(&f.violation), f.seed);
    }
    if !classes.is_empty() {
        let mut summary = String::from("distinct violations:\n");
        for (class, s) in &classes {
            summary.push_str(&format!(
                "  {class}: seeds {s:?}; replay: {}\n",
                replay_command(s[0], None)
            ));
        }
        eprintln!("{summary}");
    }
    if failures.is_empty() {
        return;
    }
    let mut msg = String::new();
    for (i, f) in failures.iter().enumerate() {
        if i == 0 || verbose {
            msg.push_str(&report(f, None));
        }
    }
    if single.is_some() && std::env::var("SIM_REDUCE").is_ok_and(|v| v != "0") {
        let (steps, reduced) = reduce(failures[0].seed, &cfg, &failures[0]);
        msg = format!(
            "{}\nreduced to {} of {} steps:\n{}",
            msg,
            steps.len(),
            failures[0].step.min(cfg.ops),
            report(&reduced, Some(&steps))
        );
    }
    panic!("{msg}{} of {} seeds failed", failures.len(), seeds.len());
}

/// Determinism of the multi-mount simulation: one seed, run twice, gives the same op log.
#[test]
fn a_shared_seed_replays_the_same_run() {
    let cfg = RunCfg {
        ops: env_num("SIM_OPS", 60) as usize,
        mounts: 3,
        allow: ["I2", "I3", "I4", "I8", "I9"]
            .into_iter()
            .map(String::from)
            .collect(),
    };
    let text = |seed: u64| -> Vec<String> {
        let (mut lines, verdict) = match run_seed(seed, &cfg, None) {
            Ok(p) => (p.log, "passed".to_string()),
            Err(f) => (
                f.log,
                format!("[{}] {}", f.violation.inv, f.violation.detail),
            ),
        };
        lines.push(verdict);
        lines
            .into_iter()
            .filter(|l| !l.trim_start().starts_with("core:"))
            .collect()
    };
    let mut diverged = Vec::new();
    for seed in [1, 4, 9] {
        let (a, b) = (text(seed), text(seed));
        if a != b {
            let at = a
                .iter()
                .zip(&b)
                .position(|(x, y)| x != y)
                .unwrap_or(a.len().min(b.len()));
            let line = |v: &Vec<String>| v.get(at).cloned().unwrap_or_else(|| "(end)".into());
            diverged.push(format!(
                "seed {seed} diverged at line {at}:\n    first:  {}\n    second: {}",
                line(&a),
                line(&b)
            ));
        }
    }
    assert!(
        diverged.is_empty(),
        "the multi-mount simulation is not deterministic:\n  {}",
        diverged.join("\n  ")
    );
}
