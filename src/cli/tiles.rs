//! `--tile`, `--tile-size`, `--max-memory`, …: the tiling flags of decode,
//! encode, memory and the benchmarks, and how a tiling is printed.

use wgvae::tiling::{TileMode, Tiling, TilingReport};

#[derive(clap::Args, Clone)]
pub(crate) struct TileArgs {
    /// Tiling: auto (untiled when the run fits --max-memory and the device's limits,
    /// else exact), off, exact (equals the untiled run up to rounding; global GroupNorm
    /// statistics) or fast (independent overlapping tiles blended like diffusers).
    #[arg(long, default_value = "auto")]
    pub(crate) tile: String,
    /// Tile side in image pixels (decode output, encode input; multiple of 8). Default:
    /// the largest that fits --max-memory (exact/auto), 512 (fast).
    #[arg(long)]
    pub(crate) tile_size: Option<usize>,
    /// fast: overlap of neighbouring tiles in image pixels (default: a quarter tile).
    #[arg(long)]
    pub(crate) tile_overlap: Option<usize>,
    /// Peak device memory of the decode or encode, weights included: bytes, or with a
    /// K/M/G/KiB/MiB/GiB suffix. Default: 3/4 of the device's max_buffer_size
    /// clamped to [1 GiB, 16 GiB] (wgpu reports no VRAM size).
    #[arg(long)]
    pub(crate) max_memory: Option<String>,
    /// exact: most host memory for tiles parked off the device (bytes or K/M/G/KiB/MiB/GiB).
    /// Default: MemAvailable of /proc/meminfo; an image run that needs more fails before
    /// decoding, a video when its next parked tile would pass it.
    #[arg(long)]
    pub(crate) max_host_memory: Option<String>,
    /// exact: tile the mid-block even when it fits whole.
    #[arg(long, hide = true)]
    pub(crate) tile_mid_block: bool,
}

impl TileArgs {
    pub(crate) fn tiling(&self) -> wgvae::Result<Tiling> {
        let mode = self.tile.parse::<TileMode>()?;
        if self.tile_overlap.is_some() && mode != TileMode::Fast {
            return Err(wgvae::Error::InvalidInput(format!(
                "--tile-overlap applies to --tile fast only (exact tiles need no overlap: their halos are exact), not --tile {}",
                mode.name()
            )));
        }
        // Tiles are whole latent pixels (8 image pixels): say so rather than round silently.
        for (flag, v) in [
            ("--tile-size", self.tile_size),
            ("--tile-overlap", self.tile_overlap),
        ] {
            match v {
                Some(px) if px % 8 != 0 || (px == 0 && flag == "--tile-size") => {
                    let up = px.max(1).div_ceil(8) * 8;
                    return Err(wgvae::Error::InvalidInput(format!(
                        "{flag} {px}: expected a positive multiple of 8 image pixels (one latent pixel is 8×8), e.g. {flag} {up}"
                    )));
                }
                _ => {}
            }
        }
        Ok(Tiling {
            mode,
            tile_size: self.tile_size,
            overlap: self.tile_overlap,
            max_memory: self
                .max_memory
                .as_deref()
                .map(|s| parse_bytes("--max-memory", s))
                .transpose()?,
            tile_mid_block: self.tile_mid_block,
            max_host_memory: self
                .max_host_memory
                .as_deref()
                .map(|s| parse_bytes("--max-host-memory", s))
                .transpose()?,
        })
    }
}

/// `--tile` for benchmarks: as [`TileArgs`], default off.
#[derive(clap::Args, Clone)]
pub(crate) struct BenchTileArgs {
    /// off, auto, exact or fast (see `wgvae decode --help`).
    #[arg(long, default_value = "off")]
    tile: String,
    /// Tile side in image pixels (multiple of 8).
    #[arg(long)]
    tile_size: Option<usize>,
    /// fast: overlap of neighbouring tiles in image pixels.
    #[arg(long)]
    tile_overlap: Option<usize>,
    /// Peak device memory (as `wgvae decode --max-memory`).
    #[arg(long)]
    max_memory: Option<String>,
}

impl BenchTileArgs {
    pub(crate) fn tiling(&self) -> wgvae::Result<Tiling> {
        TileArgs {
            tile: self.tile.clone(),
            tile_size: self.tile_size,
            tile_overlap: self.tile_overlap,
            max_memory: self.max_memory.clone(),
            max_host_memory: None,
            tile_mid_block: false,
        }
        .tiling()
    }

    /// The settings as given, for report headers.
    pub(crate) fn describe(&self) -> String {
        let mut s = format!("tile {}", self.tile);
        if let Some(px) = self.tile_size {
            s += &format!(", tile size {px}");
        }
        if let Some(o) = self.tile_overlap {
            s += &format!(", overlap {o}");
        }
        if let Some(m) = &self.max_memory {
            s += &format!(", max memory {m}");
        }
        s
    }
}

/// `1073741824`, `1GiB`, `1.5G`, `512MiB`, `800M` (K/M/G are powers of 1024).
pub(crate) fn parse_bytes(option: &str, s: &str) -> wgvae::Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => 0,
    };
    match num.trim().parse::<f64>() {
        Ok(v) if scale > 0 && v > 0.0 => Ok((v * scale as f64) as u64),
        _ => Err(wgvae::Error::InvalidInput(format!(
            "{option} `{s}`: expected bytes, e.g. 1073741824, 1GiB or 800MiB"
        ))),
    }
}

/// The tiling a decode or encode used, in one line.
pub(crate) fn print_tiling(t: &TilingReport) {
    let mib = |b: u64| b as f64 / 1048576.0;
    match t.mode.as_str() {
        "exact" => {
            println!(
                "tiling: exact, {}-pixel tiles ({} tiles, {}), budget {:.0} MiB",
                t.tile_size.unwrap_or(0),
                t.tiles,
                if t.mid_block_tiled {
                    "mid-block tiled"
                } else {
                    "mid-block whole"
                },
                mib(t.max_memory),
            );
            println!("  tile side per level: {}", level_sides(&t.level_tiles));
            for (what, v) in [
                ("device parking peak", amount(t.device_parked_peak_bytes)),
                ("host parking peak", amount(t.host_parked_peak_bytes)),
                ("staging peak", amount(t.staging_peak_bytes)),
                ("uploaded", amount(t.uploaded_bytes)),
                ("syncs", t.syncs.to_string()),
                ("tile steps", t.steps.to_string()),
            ] {
                println!("  {what:<22} {v:>14}");
            }
            if t.extrapolated {
                println!("  (planned on a few rows of tiles, which peak as every row does; the counts above extrapolated to every row)");
            }
        }
        "fast" => println!(
            "tiling: fast, {}-pixel tiles, overlap {} ({} tiles), budget {:.0} MiB",
            t.tile_size.unwrap_or(0),
            t.overlap.unwrap_or(0),
            t.tiles,
            mib(t.max_memory)
        ),
        _ => println!(
            "tiling: none (fits the budget of {:.0} MiB)",
            mib(t.max_memory)
        ),
    }
}

/// `bytes` in MiB, or GiB / TiB from 10 of them (host parking at huge sizes).
fn amount(bytes: u64) -> String {
    let b = bytes as f64;
    match b / 1048576.0 {
        m if m >= 10.0 * 1048576.0 => format!("{:.1} TiB", m / 1048576.0),
        m if m >= 10.0 * 1024.0 => format!("{:.1} GiB", m / 1024.0),
        m => format!("{m:.1} MiB"),
    }
}

/// `latent whole, 128 px, 256 px` for per-level tile sides (latent level
/// first; each in that level's pixels; `None`: the level runs whole).
pub(crate) fn level_sides(levels: &[Option<usize>]) -> String {
    levels
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let side = l.map_or("whole".to_string(), |px| format!("{px} px"));
            if i == 0 {
                format!("latent {side}")
            } else {
                side
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Per-level tile sides read as words, not Rust `Debug` text.
    #[test]
    fn level_sides_are_readable() {
        let s = level_sides(&[None, Some(128), Some(256)]);
        assert_eq!(s, "latent whole, 128 px, 256 px");
        assert!(!s.contains("Some") && !s.contains("None"));
        assert_eq!(level_sides(&[Some(64)]), "latent 64 px");
    }

    #[test]
    fn parse_bytes_reads_plain_and_suffixed_sizes() {
        let p = |s| parse_bytes("--max-memory", s);
        assert_eq!(p("1073741824").unwrap(), 1 << 30);
        assert_eq!(p("1GiB").unwrap(), 1 << 30);
        assert_eq!(p("1.5G").unwrap(), 3 << 29);
        assert_eq!(p(" 512 MiB ").unwrap(), 512 << 20);
        assert_eq!(p("800m").unwrap(), 800 << 20);
        assert_eq!(p("64k").unwrap(), 64 << 10);
        assert_eq!(p("100b").unwrap(), 100);
        for bad in ["", "GiB", "-1G", "0", "1.5X", "lots"] {
            let e = p(bad).unwrap_err().to_string();
            assert!(
                e.contains("--max-memory") && e.contains("expected bytes"),
                "{bad}: {e}"
            );
        }
        let e = parse_bytes("--max-host-memory", "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("--max-host-memory"), "{e}");
    }
}
