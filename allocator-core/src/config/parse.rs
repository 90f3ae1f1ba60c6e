//! The tokenizer and grammar of the `key:value,...` settings syntax (PyTorch's
//! `ConfigTokenizer` and the loop over its tokens): a string becomes a list of
//! [`Entry`]s, or a [`ConfigError::Syntax`]-like error naming the position. No key
//! or value is interpreted here; see `apply.rs`.

use super::ConfigError;

/// One token and the 0-based character position of its first character.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Token {
    pub(super) text: String,
    pub(super) pos: usize,
}

impl Token {
    fn is_separator(&self) -> bool {
        matches!(self.text.as_str(), "," | ":" | "[" | "]")
    }

    pub(super) fn is(&self, s: &str) -> bool {
        self.text == s
    }
}

/// The whitespace PyTorch's tokenizer drops: C's `isspace` in the C locale, which
/// it applies to each byte (so no character outside ASCII is whitespace to it).
/// Rust's `char::is_ascii_whitespace` leaves out the vertical tab.
fn is_c_space(ch: char) -> bool {
    matches!(ch, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r')
}

/// PyTorch's `ConfigTokenizer`: `,` `:` `[` `]` are tokens; ASCII whitespace
/// ([`is_c_space`]) is dropped; other runs of characters are one token. Returns the
/// tokens and the input length in characters.
pub(super) fn tokenize(s: &str) -> (Vec<Token>, usize) {
    let mut tokens = Vec::new();
    let mut buffer: Option<Token> = None;
    let mut len = 0;
    for (pos, ch) in s.chars().enumerate() {
        len = pos + 1;
        if matches!(ch, ',' | ':' | '[' | ']') {
            tokens.extend(buffer.take());
            tokens.push(Token {
                text: ch.to_string(),
                pos,
            });
        } else if !is_c_space(ch) {
            buffer
                .get_or_insert_with(|| Token {
                    text: String::new(),
                    pos,
                })
                .text
                .push(ch);
        }
    }
    tokens.extend(buffer);
    (tokens, len)
}

/// A value as written: one token, or a `[k:v,…]` list.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum RawValue {
    Scalar(Token),
    List(Vec<(Token, Token)>),
}

/// One `key:value` pair.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Entry {
    pub(super) key: Token,
    pub(super) value: RawValue,
}

const EXPECTED_KEY: &str = "an option name";
const EXPECTED_COLON: &str = "':' after the option name";
const EXPECTED_COLON_NOT_EQ: &str = "':' between option name and value (not '=')";
const EXPECTED_VALUE: &str = "a value";
const EXPECTED_NEXT: &str = "',' or the end of the settings after the value";
const EXPECTED_LIST_KEY: &str = "a list interval (a power of two in MiB, or '>')";
const EXPECTED_LIST_COLON: &str = "':' after the list interval";
const EXPECTED_LIST_VALUE: &str = "a number of divisions";
const EXPECTED_LIST_NEXT: &str = "',' or ']' in the list";

/// Cursor over the tokens.
struct Parser {
    tokens: Vec<Token>,
    i: usize,
    end: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.i)
    }

    fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.i).cloned();
        self.i += 1;
        t
    }

    fn syntax(
        &self,
        tok: Option<&Token>,
        expected: &'static str,
        key: Option<&Token>,
    ) -> ConfigError {
        ConfigError::Syntax {
            position: tok.map_or(self.end, |t| t.pos),
            expected,
            found: tok.map(|t| t.text.clone()),
            key: key.map(|k| k.text.clone()),
        }
    }

    /// `key:value(,key:value)*` or nothing.
    fn entries(mut self) -> Result<Vec<Entry>, ConfigError> {
        let mut entries = Vec::new();
        if self.tokens.is_empty() {
            return Ok(entries);
        }
        loop {
            let key = match self.next() {
                Some(t) if !t.is_separator() => t,
                other => return Err(self.syntax(other.as_ref(), EXPECTED_KEY, None)),
            };
            match self.next() {
                Some(t) if t.is(":") => {}
                other => {
                    let expected = if key.text.contains('=') {
                        EXPECTED_COLON_NOT_EQ
                    } else {
                        EXPECTED_COLON
                    };
                    return Err(self.syntax(other.as_ref(), expected, Some(&key)));
                }
            }
            let value = self.value(&key)?;
            entries.push(Entry { key, value });
            match self.next() {
                None => return Ok(entries),
                // One trailing comma ends the settings, as in PyTorch.
                Some(t) if t.is(",") && self.peek().is_none() => return Ok(entries),
                Some(t) if t.is(",") => {}
                Some(t) => {
                    return Err(self.syntax(
                        Some(&t),
                        EXPECTED_NEXT,
                        entries.last().map(|e| &e.key),
                    ))
                }
            }
        }
    }

    /// A token or a `[k:v(,k:v)*]` list, after `key:`.
    fn value(&mut self, key: &Token) -> Result<RawValue, ConfigError> {
        let empty = |position| ConfigError::EmptyValue {
            key: key.text.clone(),
            position,
        };
        match self.next() {
            None => Err(empty(self.end)),
            Some(t) if t.is(",") => Err(empty(t.pos)),
            Some(t) if t.is("[") => self.list(key, t.pos),
            Some(t) if t.is_separator() => Err(self.syntax(Some(&t), EXPECTED_VALUE, Some(key))),
            Some(t) => Ok(RawValue::Scalar(t)),
        }
    }

    /// The rest of a list after its `[` (at character `open`).
    fn list(&mut self, key: &Token, open: usize) -> Result<RawValue, ConfigError> {
        let unclosed = || ConfigError::MissingClosingBracket {
            key: key.text.clone(),
            position: open,
        };
        let mut items = Vec::new();
        loop {
            // `]` right after `[` or after a comma closes the list, as in PyTorch:
            // `[]` is an empty list and `[64:8,]` has one entry.
            if self.peek().is_some_and(|t| t.is("]")) {
                self.i += 1;
                return Ok(RawValue::List(items));
            }
            let k = match self.next() {
                None => return Err(unclosed()),
                Some(t) if t.is_separator() => {
                    return Err(self.syntax(Some(&t), EXPECTED_LIST_KEY, Some(key)))
                }
                Some(t) => t,
            };
            match self.next() {
                None => return Err(unclosed()),
                Some(t) if t.is(":") => {}
                Some(t) => return Err(self.syntax(Some(&t), EXPECTED_LIST_COLON, Some(key))),
            }
            let v = match self.next() {
                None => return Err(unclosed()),
                Some(t) if t.is_separator() => {
                    return Err(self.syntax(Some(&t), EXPECTED_LIST_VALUE, Some(key)))
                }
                Some(t) => t,
            };
            items.push((k, v));
            match self.next() {
                None => return Err(unclosed()),
                Some(t) if t.is("]") => return Ok(RawValue::List(items)),
                Some(t) if t.is(",") => {}
                Some(t) => return Err(self.syntax(Some(&t), EXPECTED_LIST_NEXT, Some(key))),
            }
        }
    }
}

/// Tokenizes and checks the grammar of `s`; no key or value is interpreted yet.
pub(super) fn parse_entries(s: &str) -> Result<Vec<Entry>, ConfigError> {
    let (tokens, end) = tokenize(s);
    Parser { tokens, i: 0, end }.entries()
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{cfg, err};
    use super::*;
    use crate::config::IntegerProblem;

    #[test]
    fn tokenizer_drops_whitespace_inside_tokens() {
        let (tokens, len) = tokenize(" max_split _size_mb : 6 4 ,a");
        let texts: Vec<&str> = tokens.iter().map(|t| t.text.as_str()).collect();
        assert_eq!(texts, ["max_split_size_mb", ":", "64", ",", "a"]);
        assert_eq!(
            tokens.iter().map(|t| t.pos).collect::<Vec<_>>(),
            [1, 20, 22, 26, 27]
        );
        assert_eq!(len, 28);
        assert_eq!(cfg(" max_split_size_mb : 6 4 ").max_split_size, 64 << 20);
        // Only ASCII whitespace, vertical tab included, is dropped (C's isspace).
        let (tokens, len) = tokenize("a\u{b}b\u{c}\r:\u{3000}1\u{a0}");
        let texts: Vec<&str> = tokens.iter().map(|t| t.text.as_str()).collect();
        assert_eq!(texts, ["ab", ":", "\u{3000}1\u{a0}"]);
        assert_eq!(len, 9);
        assert_eq!(
            err("max\u{3000}_split_size_mb:40"),
            ConfigError::UnknownKey {
                key: "max\u{3000}_split_size_mb".into()
            }
        );
        assert_eq!(
            err("max_split_size_mb:175\u{3000}2186044416"),
            ConfigError::InvalidInteger {
                key: "max_split_size_mb",
                value: "175\u{3000}2186044416".into(),
                problem: IntegerProblem::NotANumber
            }
        );
    }

    #[test]
    fn syntax_errors() {
        let syntax = |s: &str| match err(s) {
            ConfigError::Syntax {
                position,
                expected,
                found,
                key,
            } => (position, expected, found, key),
            other => panic!("{s}: expected a syntax error, got {other:?}"),
        };
        assert_eq!(
            syntax("max_split_size_mb=64"),
            (
                20,
                EXPECTED_COLON_NOT_EQ,
                None,
                Some("max_split_size_mb=64".into())
            )
        );
        assert_eq!(syntax("a;b"), (3, EXPECTED_COLON, None, Some("a;b".into())));
        assert_eq!(
            syntax("max_split_size_mb:64:1"),
            (
                20,
                EXPECTED_NEXT,
                Some(":".into()),
                Some("max_split_size_mb".into())
            )
        );
        // One trailing comma is allowed (as in PyTorch), two are not.
        assert_eq!(
            syntax("expandable_segments:True,,"),
            (25, EXPECTED_KEY, Some(",".into()), None)
        );
        assert_eq!(syntax(","), (0, EXPECTED_KEY, Some(",".into()), None));
        assert_eq!(
            syntax("expandable_segments:True,,max_split_size_mb:64"),
            (25, EXPECTED_KEY, Some(",".into()), None)
        );
        assert_eq!(
            syntax(",expandable_segments:True"),
            (0, EXPECTED_KEY, Some(",".into()), None)
        );
        assert_eq!(syntax(":64"), (0, EXPECTED_KEY, Some(":".into()), None));
        assert_eq!(
            syntax("max_split_size_mb::64"),
            (
                18,
                EXPECTED_VALUE,
                Some(":".into()),
                Some("max_split_size_mb".into())
            )
        );
        assert_eq!(syntax("a:1 b:2").0, 5);
        assert_eq!(
            syntax("max_split_size_mb 64"),
            (20, EXPECTED_COLON, None, Some("max_split_size_mb64".into()))
        );
        assert_eq!(
            err("max_split_size_mb:"),
            ConfigError::EmptyValue {
                key: "max_split_size_mb".into(),
                position: 18
            }
        );
        assert_eq!(
            err("max_split_size_mb:,expandable_segments:True"),
            ConfigError::EmptyValue {
                key: "max_split_size_mb".into(),
                position: 18
            }
        );
        // Syntax is checked before keys: an unknown key later does not hide it.
        assert!(matches!(
            err("foo:1,max_split_size_mb=64"),
            ConfigError::Syntax { .. }
        ));
        // Positions count characters, not bytes.
        assert_eq!(syntax("é:1:").0, 3);
    }
}
