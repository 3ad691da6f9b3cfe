//! Enums chosen by name (tile mode, dtype, memory policy…): one table of
//! values gives both the names and the parser, so they cannot drift apart.

use crate::error::{Error, Result};

/// An option value with a command-line / config name.
pub trait Named: Copy + 'static {
    /// Every value, in the order error messages list them.
    const ALL: &'static [Self];
    /// What a value is, for error messages (`tile mode`).
    const WHAT: &'static str;
    /// The value's name.
    fn name(self) -> &'static str;
}

/// Implements [`Named`] and `FromStr` for a fieldless enum from one table
/// of `Variant => "name"`, in the order messages list them.
macro_rules! named {
    ($ty:ident, $what:literal, { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $crate::named::Named for $ty {
            const ALL: &'static [Self] = &[$($ty::$variant),+];
            const WHAT: &'static str = $what;
            fn name(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }

        impl std::str::FromStr for $ty {
            type Err = $crate::error::Error;
            fn from_str(s: &str) -> $crate::error::Result<Self> {
                $crate::named::parse(s)
            }
        }
    };
}
pub(crate) use named;

/// The value of `T` named `s`; an error listing every name otherwise.
pub fn parse<T: Named>(s: &str) -> Result<T> {
    T::ALL
        .iter()
        .copied()
        .find(|v| v.name() == s)
        .ok_or_else(|| {
            let names: Vec<&str> = T::ALL.iter().map(|v| v.name()).collect();
            let (last, rest) = names.split_last().map_or(("", &[][..]), |(l, r)| (*l, r));
            Error::InvalidInput(format!(
                "unknown {} `{s}`; use {} or {last}",
                T::WHAT,
                rest.join(", ")
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Policy;
    use crate::models::Precision;
    use crate::tiling::TileMode;

    fn round_trips<T: Named + PartialEq + std::fmt::Debug>() {
        for &v in T::ALL {
            assert_eq!(parse::<T>(v.name()).unwrap(), v);
        }
        let err = parse::<T>("nope").unwrap_err().to_string();
        assert!(
            err.contains(&format!("unknown {} `nope`", T::WHAT)),
            "{err}"
        );
        for &v in T::ALL {
            assert!(err.contains(v.name()), "{err} lists {}", v.name());
        }
    }

    #[test]
    fn every_name_parses_back_and_errors_list_them_all() {
        round_trips::<TileMode>();
        round_trips::<Precision>();
        round_trips::<Policy>();
    }
}
