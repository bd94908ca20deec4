//! The core's log lines (`SIM_LOG`), collected to be interleaved with the op log.

use std::sync::Arc;

#[derive(Clone, Default)]
pub struct CoreLog(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for CoreLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for CoreLog {
    type Writer = CoreLog;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl CoreLog {
    /// Installs a subscriber for this thread if SIM_LOG asks for one.
    pub fn install() -> Option<(CoreLog, tracing::subscriber::DefaultGuard)> {
        let level = match std::env::var("SIM_LOG").ok()?.as_str() {
            "debug" => tracing::Level::DEBUG,
            "warn" => tracing::Level::WARN,
            "trace" => tracing::Level::TRACE,
            _ => tracing::Level::INFO,
        };
        let log = CoreLog::default();
        let sub = tracing_subscriber::fmt()
            .with_writer(log.clone())
            .with_ansi(false)
            .without_time()
            .with_target(false)
            .with_max_level(level)
            .finish();
        Some((log, tracing::subscriber::set_default(sub)))
    }

    pub fn take_lines(&self) -> Vec<String> {
        let bytes = std::mem::take(&mut *self.0.lock().unwrap());
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(|l| l.to_string())
            .collect()
    }
}
