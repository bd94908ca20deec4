//! Reading objects: sequential read-ahead with parallel ranged GETs, inside a global budget.
//!
//! One HTTP stream from GCS is slow; many ranged GETs in parallel are fast. Each open handle
//! gets a [`prefetch::Reader`] that detects sequential access and keeps several parts of the
//! object in flight ahead of the reader, drawing memory from the mount's [`budget::ReadBudget`].
//! How many parts are in flight is found per reader by [`streams::Streams`], which adds streams
//! while they add throughput.
//! With `--read-cache-dir`, those GETs go through the [`cache::ReadCache`] on the local disk.

pub mod budget;
pub mod cache;
pub mod prefetch;
pub mod streams;

pub use budget::ReadBudget;
pub use cache::{ObjectCache, ReadCache, ReadCacheConfig};
pub use prefetch::{PrefetchConfig, Reader};
