//! What the two binaries share on the command line, so `bucketdrive` on Linux and
//! `bucketdrive.exe` on Windows take the same options and print the same status.
//!
//! [`options`] holds the mount options common to both platforms and turns them into the core's
//! configuration; [`logging`] sets up where and how the mount logs; [`lifecycle`] is the mount process around the adapter (connect, build, answer
//! control requests, finish uploads); [`progress`] is the client side of `status` and
//! `unmount`, over whatever transport the platform uses to reach a running mount (a Unix
//! socket, a named pipe); [`metrics`] serves the mount's metrics for `--metrics-addr`;
//! [`perfdiag`] measures the link to a bucket and recommends mount settings for it.
//! Built only with the `cli` feature, so the core itself stays free of clap.

pub mod lifecycle;
pub mod logging;
pub mod metrics;
pub mod options;
pub mod perfdiag;
pub mod progress;
