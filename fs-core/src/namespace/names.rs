//! Which object-key pieces can be shown as path components.
//!
//! GCS names may contain `//`, `.`, `..`, NUL-free but otherwise arbitrary UTF-8, and may be up to
//! 1,024 bytes, while a POSIX path component may not be empty, `.` or `..`, may not contain `/`
//! or NUL, and is at most 255 bytes. Keys whose pieces break these rules are skipped (never
//! renamed), so what a user sees always maps back to exactly one object.

/// Longest path component Linux accepts, in bytes.
pub const NAME_MAX: usize = 255;

/// Why a listed name cannot be a path component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadName {
    /// Empty, usually from `//` in the key.
    Empty,
    Dot,
    DotDot,
    Nul,
    Slash,
    TooLong,
}

/// Checks that `name` can be one path component.
pub fn check_component(name: &str) -> Result<(), BadName> {
    match name {
        "" => Err(BadName::Empty),
        "." => Err(BadName::Dot),
        ".." => Err(BadName::DotDot),
        n if n.contains('\0') => Err(BadName::Nul),
        n if n.contains('/') => Err(BadName::Slash),
        n if n.len() > NAME_MAX => Err(BadName::TooLong),
        _ => Ok(()),
    }
}

/// Joins a directory path (relative, no leading `/`, `""` for the root) and a component.
pub fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components() {
        assert_eq!(check_component("a.txt"), Ok(()));
        assert_eq!(check_component(""), Err(BadName::Empty));
        assert_eq!(check_component("."), Err(BadName::Dot));
        assert_eq!(check_component(".."), Err(BadName::DotDot));
        assert_eq!(check_component("a\0b"), Err(BadName::Nul));
        assert_eq!(check_component("a/b"), Err(BadName::Slash));
        assert_eq!(check_component(&"x".repeat(256)), Err(BadName::TooLong));
        assert_eq!(check_component(&"x".repeat(255)), Ok(()));
        assert_eq!(check_component("..."), Ok(()));
    }

    #[test]
    fn joins() {
        assert_eq!(join("", "a"), "a");
        assert_eq!(join("a/b", "c"), "a/b/c");
    }
}
