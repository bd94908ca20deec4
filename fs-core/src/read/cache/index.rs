//! The in-memory index of the cache: which files exist, which of their blocks may be read,
//! what each costs on disk, and the least-recently-used order across all of them.
//!
//! Every decision about the cache directory is made here, under one lock, in memory; the
//! disk work it implies (writing blocks, deleting files) is done by the caller after the lock
//! is released. The rules:
//!
//! - **Charges are disk bytes.** An entry is charged its header and records when created, and
//!   each block its page-rounded length when the block is reserved for writing, before any byte
//!   is written. `used` never exceeds the cap: a reservation first evicts other entries, least
//!   recently used first, and is cut short (or refused) when even evicting every other entry
//!   would not make room. A block that turns out bad stays charged (its bytes are still on
//!   disk) until it is rewritten or its entry goes.
//! - **Only `Present` blocks are read.** A block is `Pending` while the writer writes it and
//!   becomes `Present` only after its bytes and record are written. A block found bad is
//!   `Dropped` and read from the bucket until refilled.
//! - **Eviction is per entry**, the whole file at once. Each entry has an epoch, new for every
//!   entry created, so anyone who looked at an entry before an eviction can tell afterwards
//!   that what they saw is gone, and a file recreated under the same name is a new entry.
//! - Entries found on disk at start-up are known only by name and size until first opened
//!   (`blocks: None`); opening one reads its records and installs them.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use super::file::Identity;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Block {
    /// Not on disk.
    Absent,
    /// Charged and being written; not readable yet.
    Pending,
    /// Written with its record; readable (its CRC is still checked on every read).
    Present,
    /// Failed a read-back check, or its write failed: charged, not readable, refillable.
    Dropped,
}

#[derive(Debug)]
pub struct Entry {
    pub epoch: u64,
    tick: u64,
    pub charged: u64,
    /// `None` until the file's records are loaded in this mount.
    pub blocks: Option<Vec<Block>>,
    /// Whether this mount checked every block of the file whole, for the kernel to read it
    /// itself (passthrough reads are not checked one by one).
    pub verified: Verified,
}

/// Where a whole file's check stands ([`super::file::verify`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Verified {
    #[default]
    No,
    Running,
    /// Every block checked out, and none has changed since.
    Yes,
}

/// Whether a read can be served from disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Every block is present in the entry of this epoch.
    Hit {
        epoch: u64,
    },
    Miss,
}

/// Blocks the writer may now write.
#[derive(Debug, PartialEq, Eq)]
pub struct Reserved {
    pub epoch: u64,
    /// The file does not exist yet: create it (with its header) first.
    pub create: bool,
    /// Ascending block numbers, all now `Pending`.
    pub blocks: Vec<u64>,
    /// Entries evicted to make room: (name, epoch). Their files must be deleted.
    pub evicted: Vec<(String, u64)>,
}

#[derive(Debug)]
pub struct Index {
    cap: u64,
    used: u64,
    next_tick: u64,
    next_epoch: u64,
    entries: HashMap<String, Entry>,
    /// tick -> name, oldest first.
    lru: BTreeMap<u64, String>,
}

impl Index {
    pub fn new(cap: u64) -> Self {
        Index {
            cap,
            used: 0,
            next_tick: 0,
            next_epoch: 1,
            entries: HashMap::new(),
            lru: BTreeMap::new(),
        }
    }

    #[cfg(test)]
    pub fn cap(&self) -> u64 {
        self.cap
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries.get(name)
    }

    fn tick(&mut self) -> u64 {
        self.next_tick += 1;
        self.next_tick
    }

    fn epoch(&mut self) -> u64 {
        self.next_epoch += 1;
        self.next_epoch
    }

    /// Adds a file found on disk, charged `bytes`; call in order of last use, oldest first.
    pub fn add_unloaded(&mut self, name: String, bytes: u64) {
        let (tick, epoch) = (self.tick(), self.epoch());
        self.lru.insert(tick, name.clone());
        self.used += bytes;
        self.entries.insert(
            name,
            Entry {
                epoch,
                tick,
                charged: bytes,
                blocks: None,
                verified: Verified::No,
            },
        );
    }

    /// Marks `name` as just used.
    pub fn touch(&mut self, name: &str) {
        let tick = self.tick();
        if let Some(e) = self.entries.get_mut(name) {
            self.lru.remove(&e.tick);
            e.tick = tick;
            self.lru.insert(tick, name.to_string());
        }
    }

    /// Whether `blocks` can be read from disk; counts as a use of the entry either way.
    pub fn plan(&mut self, name: &str, blocks: Range<u64>) -> Plan {
        self.touch(name);
        match self.entries.get(name) {
            Some(Entry {
                epoch,
                blocks: Some(states),
                ..
            }) if blocks.end as usize <= states.len()
                && states[blocks.start as usize..blocks.end as usize]
                    .iter()
                    .all(|b| *b == Block::Present) =>
            {
                Plan::Hit { epoch: *epoch }
            }
            _ => Plan::Miss,
        }
    }

    /// Installs the records loaded for an entry found on disk, if it is still the entry of
    /// `epoch` and not loaded yet. Its charge becomes at least what its present blocks cost.
    pub fn install(&mut self, name: &str, epoch: u64, present: &[bool], id: &Identity) -> bool {
        let Some(e) = self.entries.get_mut(name) else {
            return false;
        };
        if e.epoch != epoch || e.blocks.is_some() {
            return false;
        }
        let mut cost = id.index_charge();
        let mut states = Vec::with_capacity(present.len());
        for (i, p) in present.iter().enumerate() {
            states.push(if *p {
                cost += id.block_charge(i as u64);
                Block::Present
            } else {
                Block::Absent
            });
        }
        if cost > e.charged {
            self.used += cost - e.charged;
            e.charged = cost;
        }
        e.blocks = Some(states);
        true
    }

    /// Forgets `name`, releasing its charge. The caller deletes its file.
    pub fn remove(&mut self, name: &str) -> Option<Entry> {
        let e = self.entries.remove(name)?;
        self.lru.remove(&e.tick);
        self.used -= e.charged;
        Some(e)
    }

    /// Evicts least recently used entries until the charges fit the cap (after start-up, or
    /// if the cap was lowered). Returns what was evicted.
    pub fn trim(&mut self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        while self.used > self.cap {
            let Some((_, name)) = self.lru.iter().next().map(|(t, n)| (*t, n.clone())) else {
                break;
            };
            if let Some(e) = self.remove(&name) {
                out.push((name, e.epoch));
            }
        }
        out
    }

    /// Whether writing `blocks` of `name` would add anything: the entry is new, or one of them
    /// is absent or dropped.
    pub fn wants(&self, name: &str, blocks: Range<u64>) -> bool {
        match self.entries.get(name) {
            None => true,
            Some(Entry { blocks: None, .. }) => false,
            Some(Entry {
                blocks: Some(states),
                ..
            }) => states
                .get(blocks.start as usize..blocks.end as usize)
                .is_some_and(|s| {
                    s.iter()
                        .any(|b| matches!(b, Block::Absent | Block::Dropped))
                }),
        }
    }

    /// Reserves room for the absent or dropped blocks among `blocks` of `id`, evicting other
    /// entries as needed, and marks them `Pending`. When not all fit under the cap even with
    /// every other entry evicted, the first ones that fit are reserved. `None`: nothing to
    /// write, nothing fits, or the entry is on disk but not loaded.
    pub fn reserve(&mut self, id: &Identity, blocks: Range<u64>) -> Option<Reserved> {
        let name = id.name();
        let (create, kept) = match self.entries.get(name) {
            None => (true, id.index_charge()),
            Some(Entry { blocks: None, .. }) => return None,
            Some(e) => (false, e.charged),
        };
        if kept > self.cap {
            return None;
        }
        let mut room = self.cap - kept;
        let states = self.entries.get(name).and_then(|e| e.blocks.as_ref());
        let mut chosen = Vec::new();
        let mut cost = 0;
        for i in blocks.start..blocks.end.min(id.blocks()) {
            let state = states
                .and_then(|s| s.get(i as usize).copied())
                .unwrap_or(Block::Absent);
            let c = match state {
                Block::Absent => id.block_charge(i),
                Block::Dropped => 0,
                Block::Pending | Block::Present => continue,
            };
            if c > room {
                break;
            }
            room -= c;
            cost += c;
            chosen.push(i);
        }
        if chosen.is_empty() {
            return None;
        }
        let need = cost + if create { id.index_charge() } else { 0 };
        let mut evicted = Vec::new();
        // Room was computed with every other entry gone, so this always ends in time.
        while self.used + need > self.cap {
            let Some(victim) = self.lru.values().find(|n| n.as_str() != name).cloned() else {
                break;
            };
            if let Some(e) = self.remove(&victim) {
                evicted.push((victim, e.epoch));
            }
        }
        debug_assert!(self.used + need <= self.cap);
        if create {
            let (tick, epoch) = (self.tick(), self.epoch());
            self.lru.insert(tick, name.to_string());
            self.entries.insert(
                name.to_string(),
                Entry {
                    epoch,
                    tick,
                    charged: 0,
                    blocks: Some(vec![Block::Absent; id.blocks() as usize]),
                    verified: Verified::No,
                },
            );
        }
        let e = self.entries.get_mut(name)?;
        e.verified = Verified::No;
        e.charged += need;
        self.used += need;
        if let Some(states) = e.blocks.as_mut() {
            for &i in &chosen {
                if let Some(s) = states.get_mut(i as usize) {
                    *s = Block::Pending;
                }
            }
        }
        Some(Reserved {
            epoch: e.epoch,
            create,
            blocks: chosen,
            evicted,
        })
    }

    /// Ends a reservation: its blocks become `Present` (`ok`) or `Dropped`. False when the
    /// entry of `epoch` is gone (evicted or removed meanwhile).
    pub fn complete(&mut self, name: &str, epoch: u64, blocks: &[u64], ok: bool) -> bool {
        match self.entries.get_mut(name) {
            Some(Entry {
                epoch: e,
                blocks: Some(states),
                ..
            }) if *e == epoch => {
                for &i in blocks {
                    if let Some(s) = states.get_mut(i as usize) {
                        if *s == Block::Pending {
                            *s = if ok { Block::Present } else { Block::Dropped };
                        }
                    }
                }
                true
            }
            _ => false,
        }
    }

    /// Marks `blocks` of the entry of `epoch` unreadable. Returns how many were present
    /// (0 when the entry changed since the caller looked: what it read was not this entry's).
    pub fn drop_blocks(&mut self, name: &str, epoch: u64, blocks: &[u64]) -> usize {
        let mut n = 0;
        if let Some(Entry {
            epoch: e,
            blocks: Some(states),
            ..
        }) = self.entries.get_mut(name)
        {
            if *e == epoch {
                for &i in blocks {
                    if let Some(s) = states.get_mut(i as usize) {
                        if *s == Block::Present {
                            *s = Block::Dropped;
                            n += 1;
                        }
                    }
                }
            }
        }
        if n > 0 {
            if let Some(e) = self.entries.get_mut(name) {
                e.verified = Verified::No;
            }
        }
        n
    }

    /// Whether the entry of `name` holds every block of its object, and where its whole-file
    /// check stands: `Some((epoch, verified))`, `None` when it is not all there (or not loaded).
    pub fn whole(&self, name: &str) -> Option<(u64, Verified)> {
        let e = self.entries.get(name)?;
        let states = e.blocks.as_ref()?;
        states
            .iter()
            .all(|b| *b == Block::Present)
            .then_some((e.epoch, e.verified))
    }

    /// Records where the whole-file check of the entry of `epoch` stands; false when that entry
    /// is gone (or not whole any more: a check that began on it no longer says anything).
    pub fn set_verified(&mut self, name: &str, epoch: u64, v: Verified) -> bool {
        match self.whole(name) {
            Some((e, _)) if e == epoch => {
                if let Some(entry) = self.entries.get_mut(name) {
                    entry.verified = v;
                }
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::file::{BLOCK, PAGE};
    use super::*;
    use crate::store::ObjectMeta;

    fn id(key: &str, size: u64) -> Identity {
        let meta = ObjectMeta {
            metadata_trimmed: false,
            key: key.into(),
            generation: 1,
            metageneration: 1,
            size,
            crc32c: None,
            updated: std::time::SystemTime::UNIX_EPOCH,
            content_type: None,
            metadata: Default::default(),
        };
        Identity::new("b", &meta).unwrap()
    }

    #[test]
    fn reservations_evict_least_recently_used_and_never_pass_the_cap() {
        let a = id("a", 4 * BLOCK);
        let cost = a.index_charge() + 4 * BLOCK;
        let mut ix = Index::new(2 * cost + 10);
        let ra = ix.reserve(&a, 0..4).unwrap();
        assert!(ra.create && ra.evicted.is_empty());
        assert_eq!(
            ix.plan(a.name(), 0..1),
            Plan::Miss,
            "pending is not readable"
        );
        assert!(ix.complete(a.name(), ra.epoch, &ra.blocks, true));
        assert_eq!(ix.plan(a.name(), 0..4), Plan::Hit { epoch: ra.epoch });
        let b = id("b", 4 * BLOCK);
        let rb = ix.reserve(&b, 0..4).unwrap();
        ix.complete(b.name(), rb.epoch, &rb.blocks, true);
        assert_eq!(ix.used(), 2 * cost);
        // a was used after b: c evicts b.
        ix.touch(a.name());
        let c = id("c", 4 * BLOCK);
        let rc = ix.reserve(&c, 0..4).unwrap();
        assert_eq!(rc.evicted, vec![(b.name().to_string(), rb.epoch)]);
        assert!(ix.used() <= ix.cap());
        assert!(!ix.complete(b.name(), rb.epoch, &[0], true), "b is gone");
    }

    #[test]
    fn an_entry_larger_than_the_cap_is_kept_in_part() {
        let big = id("big", 100 * BLOCK);
        let mut ix = Index::new(big.index_charge() + 10 * BLOCK);
        let r = ix.reserve(&big, 0..100).unwrap();
        assert_eq!(r.blocks, (0..10).collect::<Vec<_>>());
        ix.complete(big.name(), r.epoch, &r.blocks, true);
        assert_eq!(
            ix.reserve(&big, 10..20),
            None,
            "no room, and nothing else to evict"
        );
        assert_eq!(ix.used(), ix.cap());
    }

    #[test]
    fn dropped_blocks_stay_charged_and_refill_for_free() {
        let a = id("a", 2 * BLOCK + 1);
        let mut ix = Index::new(1 << 30);
        let r = ix.reserve(&a, 0..3).unwrap();
        ix.complete(a.name(), r.epoch, &r.blocks, true);
        let used = ix.used();
        assert_eq!(used, a.index_charge() + 2 * BLOCK + PAGE);
        assert_eq!(
            ix.drop_blocks(a.name(), r.epoch + 1, &[1]),
            0,
            "stale epoch"
        );
        assert_eq!(ix.drop_blocks(a.name(), r.epoch, &[1]), 1);
        assert_eq!(ix.plan(a.name(), 0..3), Plan::Miss);
        assert!(ix.wants(a.name(), 0..3));
        let again = ix.reserve(&a, 0..3).unwrap();
        assert_eq!(again.blocks, vec![1]);
        assert_eq!(ix.used(), used);
    }

    #[test]
    fn unloaded_entries_install_and_trim() {
        let a = id("a", 2 * BLOCK);
        let mut ix = Index::new(a.index_charge() + 2 * BLOCK);
        ix.add_unloaded("old".into(), 3 * BLOCK);
        ix.add_unloaded(a.name().into(), 100);
        let epoch = ix.entry(a.name()).unwrap().epoch;
        assert_eq!(ix.reserve(&a, 0..2), None, "not loaded yet");
        assert!(ix.install(a.name(), epoch, &[true, false], &a));
        assert_eq!(
            ix.entry(a.name()).unwrap().charged,
            a.index_charge() + BLOCK
        );
        let trimmed = ix.trim();
        assert_eq!(trimmed.len(), 1);
        assert_eq!(trimmed[0].0, "old");
        assert!(ix.used() <= ix.cap());
        assert_eq!(ix.len(), 1);
    }
}
