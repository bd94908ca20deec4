//! The reversible mapping between object names and Windows names.
//!
//! Windows forbids `\ : * ? " < > |` and control characters in a name, strips a trailing dot or
//! space, and reserves the device names CON, PRN, AUX, NUL, COM1–9 and LPT1–9 (with any
//! extension). Object names may hold all of these. Each such character is shown as a look-alike
//! from another Unicode block, the scheme rclone uses, so Explorer shows something close to the
//! real name and a save writes the real name back:
//!
//! | object | Windows |
//! |---|---|
//! | `\ : * ? " < > \|` | their full-width forms `＼ ： ＊ ？ ＂ ＜ ＞ ｜` |
//! | control characters U+0001–U+001F | control pictures U+2401–U+241F |
//! | a trailing `.` / a trailing space | `．` (U+FF0E) / `␠` (U+2420) |
//! | a device name such as `con.txt` | its first letter full-width: `ｃon.txt` |
//!
//! The mapping is a bijection from object names onto the names it produces: an object name that
//! already contains one of those look-alikes, where decoding would turn it back, shows it behind
//! the quote `‛` (U+201B), and a literal `‛` shows as `‛‛`. So every object has exactly one
//! Windows name, and two objects never collide on one. A quote typed in Windows where the
//! mapping would not put one stands for itself.

/// The quote that marks a look-alike that stands for itself.
const QUOTE: char = '\u{201B}';

/// Characters Windows forbids anywhere in a name, and their look-alikes.
const FORBIDDEN: [(char, char); 8] = [
    ('\\', '\u{FF3C}'),
    (':', '\u{FF1A}'),
    ('*', '\u{FF0A}'),
    ('?', '\u{FF1F}'),
    ('"', '\u{FF02}'),
    ('<', '\u{FF1C}'),
    ('>', '\u{FF1E}'),
    ('|', '\u{FF5C}'),
];

const TRAILING_DOT: char = '\u{FF0E}';
const TRAILING_SPACE: char = '\u{2420}';

/// Device names Windows reserves, with or without an extension.
const DEVICES: [&str; 22] = [
    "CON", "PRN", "AUX", "NUL", "COM1", "COM2", "COM3", "COM4", "COM5", "COM6", "COM7", "COM8",
    "COM9", "LPT1", "LPT2", "LPT3", "LPT4", "LPT5", "LPT6", "LPT7", "LPT8", "LPT9",
];

/// The look-alike of a character Windows forbids anywhere, if it is one.
fn anywhere_image(c: char) -> Option<char> {
    if let Some((_, img)) = FORBIDDEN.iter().find(|(f, _)| *f == c) {
        return Some(*img);
    }
    let u = c as u32;
    (1..0x20)
        .contains(&u)
        .then(|| char::from_u32(0x2400 + u))
        .flatten()
}

/// The character a look-alike of [`anywhere_image`] stands for.
fn anywhere_original(c: char) -> Option<char> {
    if let Some((orig, _)) = FORBIDDEN.iter().find(|(_, img)| *img == c) {
        return Some(*orig);
    }
    let u = c as u32;
    (0x2401..0x2420)
        .contains(&u)
        .then(|| char::from_u32(u - 0x2400))
        .flatten()
}

/// The full-width form of an ASCII letter.
fn wide(c: char) -> Option<char> {
    c.is_ascii_alphabetic()
        .then(|| char::from_u32(c as u32 - 0x21 + 0xFF01))
        .flatten()
}

/// The ASCII letter a full-width letter stands for.
fn narrow(c: char) -> Option<char> {
    let u = c as u32;
    ((0xFF21..=0xFF3A).contains(&u) || (0xFF41..=0xFF5A).contains(&u))
        .then(|| char::from_u32(u - 0xFF01 + 0x21))
        .flatten()
}

/// Whether `first` followed by `rest` is a device name (the part before the first dot).
fn is_device(first: char, rest: &str) -> bool {
    let stem_rest = rest.split('.').next().unwrap_or("");
    let stem: String = std::iter::once(first).chain(stem_rest.chars()).collect();
    DEVICES.iter().any(|d| d.eq_ignore_ascii_case(&stem))
}

/// The rest of an object name as far as the device check reads it: as Windows will see it,
/// with a trailing dot or space already shown as its look-alike. Both directions then judge the
/// same string: `Con.` shows as `Con．`, which Windows does not reserve, so its `C` stays.
fn shown_rest(rest: &[char]) -> String {
    let mut s: String = rest.iter().collect();
    match rest.last() {
        Some('.') => {
            s.pop();
            s.push(TRAILING_DOT);
        }
        Some(' ') => {
            s.pop();
            s.push(TRAILING_SPACE);
        }
        _ => {}
    }
    s
}

/// The Windows name of the object name `name` (one path component).
pub fn to_windows(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let last = chars.len().saturating_sub(1);
    let mut out = String::with_capacity(name.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        let rest = shown_rest(&chars[i + 1..]);
        if i == 0 && is_device(c, &rest) {
            if let Some(w) = wide(c) {
                out.push(w);
                continue;
            }
        }
        if i == last && c == '.' {
            out.push(TRAILING_DOT);
            continue;
        }
        if i == last && c == ' ' {
            out.push(TRAILING_SPACE);
            continue;
        }
        if let Some(img) = anywhere_image(c) {
            out.push(img);
            continue;
        }
        // A literal look-alike that decoding would turn back gets the quote.
        let decodes = c == QUOTE
            || anywhere_original(c).is_some()
            || (i == last && (c == TRAILING_DOT || c == TRAILING_SPACE))
            || (i == 0 && narrow(c).is_some_and(|n| is_device(n, &rest)));
        if decodes {
            out.push(QUOTE);
        }
        out.push(c);
    }
    out
}

/// The object name of the Windows name `name`; the inverse of [`to_windows`].
pub fn from_windows(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let last = chars.len().saturating_sub(1);
    let mut out = String::with_capacity(name.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == QUOTE && i < last {
            // Exactly what `to_windows` quotes; any other quote stands for itself.
            let n = chars[i + 1];
            let after: String = chars[i + 2..].iter().collect();
            let quoted = n == QUOTE
                || anywhere_original(n).is_some()
                || (i + 1 == last && (n == TRAILING_DOT || n == TRAILING_SPACE))
                || (i == 0 && narrow(n).is_some_and(|m| is_device(m, &after)));
            if quoted {
                out.push(n);
                i += 2;
                continue;
            }
        }
        let rest: String = chars[i + 1..].iter().collect();
        let decoded = if i == 0 {
            narrow(c).filter(|n| is_device(*n, &rest))
        } else {
            None
        }
        .or_else(|| match c {
            TRAILING_DOT if i == last => Some('.'),
            TRAILING_SPACE if i == last => Some(' '),
            _ => anywhere_original(c),
        });
        out.push(decoded.unwrap_or(c));
        i += 1;
    }
    out
}

/// A name as Windows compares it: each UTF-16 unit through Windows' upcase table, which maps
/// one unit to one unit. A letter whose capital is not a single BMP character (`ß`, `ŉ`) is
/// kept, and characters outside the BMP are never changed, so `straße.txt` and `STRASSE.TXT`
/// are different names, as they are on NTFS. Every case-insensitive comparison in the Windows
/// view goes through this one function, so a lookup and a uniqueness check can never disagree.
pub fn fold(name: &str) -> String {
    name.chars().map(fold_char).collect()
}

fn fold_char(c: char) -> char {
    if u32::from(c) > 0xFFFF {
        return c;
    }
    let mut upper = c.to_uppercase();
    match (upper.next(), upper.next()) {
        (Some(u), None) if u32::from(u) <= 0xFFFF => u,
        _ => c,
    }
}

/// Whether a name is one Windows accepts as it is (nothing in it needs mapping).
pub fn is_windows_safe(name: &str) -> bool {
    to_windows(name) == name
}

/// Windows names for one directory's object names: the mapped name, made unique without regard
/// to case, since Windows looks names up case-insensitively. Among names that differ only by
/// case, the first in byte order keeps its name; each other one gets ` (case N)` before its
/// extension, with the smallest N ≥ 2 that collides with nothing else in the directory. The
/// result depends only on the set of names, so every listing shows the same thing.
pub fn directory_names<'a>(
    object_names: impl IntoIterator<Item = &'a str>,
) -> Vec<(String, String)> {
    let mut names: Vec<&str> = object_names.into_iter().collect();
    names.sort_unstable();
    names.dedup();
    let mut taken: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(names.len());
    let mut collided = Vec::new();
    for name in names {
        let win = to_windows(name);
        if taken.insert(fold(&win)) {
            out.push((name.to_string(), win));
        } else {
            collided.push((name, win));
        }
    }
    for (name, win) in collided {
        let (stem, ext) = match win.rfind('.') {
            Some(i) if i > 0 => win.split_at(i),
            _ => (win.as_str(), ""),
        };
        let mut n = 2;
        let unique = loop {
            let candidate = format!("{stem} (case {n}){ext}");
            if taken.insert(fold(&candidate)) {
                break candidate;
            }
            n += 1;
        };
        out.push((name.to_string(), unique));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_mapped_case_round_trips() {
        let cases = [
            ("a:b", "a\u{FF1A}b"),
            ("what?.txt", "what\u{FF1F}.txt"),
            ("back\\slash", "back\u{FF3C}slash"),
            ("star*<>|\"", "star\u{FF0A}\u{FF1C}\u{FF1E}\u{FF5C}\u{FF02}"),
            ("tab\there", "tab\u{2409}here"),
            ("\u{1}", "\u{2401}"),
            ("ends.", "ends\u{FF0E}"),
            ("ends ", "ends\u{2420}"),
            ("dots..", "dots.\u{FF0E}"),
            ("CON", "\u{FF23}ON"),
            ("con.txt", "\u{FF43}on.txt"),
            ("Lpt9.tar.gz", "\u{FF2C}pt9.tar.gz"),
            ("nul", "\u{FF4E}ul"),
            ("console", "console"),
            ("COM10", "COM10"),
            ("plain name.txt", "plain name.txt"),
            ("\u{FF1A}", "\u{201B}\u{FF1A}"),
            ("\u{201B}", "\u{201B}\u{201B}"),
            ("x\u{FF0E}", "x\u{201B}\u{FF0E}"),
            ("\u{FF0E}x", "\u{FF0E}x"),
            ("\u{FF23}ON", "\u{201B}\u{FF23}ON"),
            ("\u{FF23}AT", "\u{FF23}AT"),
            ("Con.", "Con\u{FF0E}"),
            ("\u{FF23}on.", "\u{FF23}on\u{FF0E}"),
            ("con..", "\u{FF43}on.\u{FF0E}"),
            ("日本語", "日本語"),
        ];
        for (object, windows) in cases {
            assert_eq!(to_windows(object), windows, "to_windows({object:?})");
            assert_eq!(from_windows(windows), object, "from_windows({windows:?})");
        }
        assert!(is_windows_safe("report.docx"));
        assert!(!is_windows_safe("a:b"));
    }

    #[test]
    fn names_differing_only_by_case_get_a_deterministic_suffix() {
        let got = directory_names([
            "report.txt",
            "Report.txt",
            "REPORT.TXT",
            "report (case 2).txt",
            "b",
        ]);
        let map: std::collections::HashMap<_, _> = got.into_iter().collect();
        assert_eq!(
            map["REPORT.TXT"], "REPORT.TXT",
            "first in byte order keeps its name"
        );
        assert_eq!(map["report (case 2).txt"], "report (case 2).txt");
        assert_eq!(map["Report.txt"], "Report (case 3).txt");
        assert_eq!(map["report.txt"], "report (case 4).txt");
        assert_eq!(map["b"], "b");
        // Same set, other order: same answer.
        let again = directory_names([
            "b",
            "report.txt",
            "report (case 2).txt",
            "REPORT.TXT",
            "Report.txt",
        ]);
        assert_eq!(
            again
                .into_iter()
                .collect::<std::collections::HashMap<_, _>>(),
            map
        );
    }

    #[test]
    fn folding_is_one_unit_to_one_unit() {
        assert_eq!(fold("Report.txt"), "REPORT.TXT");
        assert_eq!(fold("straße"), "STRAßE", "ß has no one-unit capital");
        assert_ne!(fold("straße.txt"), fold("STRASSE.txt"));
        assert_eq!(fold("ǆ"), "Ǆ");
        assert_eq!(fold("ΣΊΣΥΦΟΣ σίσυφος"), fold("σίσυφοσ ΣΊΣΥΦΟΣ"));
        assert_eq!(
            fold("\u{10428}"),
            "\u{10428}",
            "outside the BMP nothing changes"
        );
        assert_eq!(fold("日本語 ＡＢ ａｂ"), "日本語 ＡＢ ＡＢ");
    }

    #[test]
    fn names_equal_under_the_folding_collide_and_others_do_not() {
        // ß vs SS: two names on NTFS, so neither gets a suffix.
        let got: std::collections::HashMap<_, _> =
            directory_names(["straße.txt", "STRASSE.txt", "Ǆ", "ǆ"])
                .into_iter()
                .collect();
        assert_eq!(got["straße.txt"], "straße.txt");
        assert_eq!(got["STRASSE.txt"], "STRASSE.txt");
        assert_eq!(got["Ǆ"], "Ǆ");
        assert_eq!(got["ǆ"], "ǆ (case 2)");
    }

    fn tricky_char() -> impl Strategy<Value = char> {
        prop_oneof![
            prop::sample::select(vec![
                '\\', ':', '*', '?', '"', '<', '>', '|', '.', ' ', '\u{1}', '\u{1f}', QUOTE,
                '\u{FF1A}', '\u{FF0E}', '\u{2420}', '\u{2401}', '\u{FF23}', '\u{FF4E}', 'C', 'o',
                'n', 'N', 'U', 'L', '1', 'M', 'P', 'T',
            ]),
            any::<char>(),
        ]
    }

    proptest! {
        /// Decoding inverts encoding, encoding inverts decoding on every encoded name, and an
        /// encoded name never holds a character Windows forbids: a bijection.
        #[test]
        fn the_mapping_is_a_bijection(chars in prop::collection::vec(tricky_char(), 1..12)) {
            let name: String = chars.into_iter().filter(|c| *c != '/' && *c != '\0').collect();
            let win = to_windows(&name);
            prop_assert_eq!(from_windows(&win), name.clone());
            prop_assert_eq!(to_windows(&from_windows(&win)), win.clone());
            prop_assert!(!win.chars().any(|c| anywhere_image(c).is_some()), "{:?}", win);
            prop_assert!(!win.ends_with('.') && !win.ends_with(' '), "{:?}", win);
            let stem = win.split('.').next().unwrap_or("");
            prop_assert!(!DEVICES.iter().any(|d| d.eq_ignore_ascii_case(stem)), "{:?}", win);
        }

        /// Two different object names never share a Windows name.
        #[test]
        fn distinct_names_stay_distinct(a in prop::collection::vec(tricky_char(), 1..6),
                                        b in prop::collection::vec(tricky_char(), 1..6)) {
            let (a, b): (String, String) = (a.into_iter().collect(), b.into_iter().collect());
            if a != b {
                prop_assert_ne!(to_windows(&a), to_windows(&b));
            }
        }
    }
}
