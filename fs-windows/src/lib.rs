//! The WinFsp adapter. Empty until the Windows issue fills it: all logic lives in `fs-core`.
