//! systemd's readiness protocol (`sd_notify`), for `Type=notify` services.
//!
//! systemd starts the service with `NOTIFY_SOCKET` set and considers it started when it
//! receives `READY=1`, so units ordered after it (and `systemctl start`) wait until the mount
//! answers rather than until the process exists. `STOPPING=1` tells it the unmount has begun
//! and pending uploads are being finished, which can take a while. Without `NOTIFY_SOCKET`
//! both are no-ops.

/// Whether systemd (or another supervisor speaking its protocol) is waiting for *this*
/// process's readiness. Such a process must stay in the foreground: the supervisor tracks it,
/// and logs its standard error. A `NOTIFY_SOCKET` merely inherited (a shell or a `mount` run
/// from inside a notify service) is not ours: systemd 248 and later name the process it started
/// in `SYSTEMD_EXEC_PID`, so the variable counts only when that is us (or is not set at all,
/// as with older systemd and other supervisors).
pub fn supervised() -> bool {
    if std::env::var_os("NOTIFY_SOCKET").is_none_or(|v| v.is_empty()) {
        return false;
    }
    match std::env::var("SYSTEMD_EXEC_PID") {
        Ok(pid) => pid.trim() == std::process::id().to_string(),
        Err(_) => true,
    }
}

/// `READY=1`: the mount answers requests.
pub fn ready() {
    send(&[sd_notify::NotifyState::Ready]);
}

/// `STOPPING=1`: unmounting; pending uploads are being finished.
pub fn stopping() {
    send(&[sd_notify::NotifyState::Stopping]);
}

fn send(state: &[sd_notify::NotifyState]) {
    if !supervised() {
        return;
    }
    if let Err(e) = sd_notify::notify(state) {
        tracing::warn!("cannot notify the service manager: {e}");
    }
}
