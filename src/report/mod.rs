//! Reports: CSV + Markdown + SVG files with the device and settings they came from.

pub mod attention;
pub mod bench;
pub mod memory;

use std::path::Path;

use crate::error::{Error, Result};

pub(crate) fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

pub(crate) const MIB: f64 = 1024.0 * 1024.0;
