//! Raw YUV4MPEG2 (`.y4m`) video written frame by frame: plays in ffmpeg and
//! mpv without any codec in this crate, and needs memory for one frame only.
//!
//! Colour: BT.601 full range (JPEG's YCbCr: `Y = 0.299 R + 0.587 G +
//! 0.114 B`, chroma centred on 128, no head/foot room), marked
//! `XCOLORRANGE=FULL`. Even frame sizes use 4:2:0 with chroma centred
//! between the four luma samples it covers (`C420jpeg`: each chroma sample
//! is the mean of a 2×2 block); an odd width or height cannot be halved, so
//! such frames are 4:4:4 (`C444`).

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::kernels::image::ImageRange;

/// Chroma sampling of a `.y4m` stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chroma {
    /// 4:2:0, chroma centred in each 2×2 block (JPEG / MPEG-1 siting).
    C420Jpeg,
    /// 4:4:4: one chroma sample per pixel.
    C444,
}

impl Chroma {
    /// 4:2:0 when both sizes are even, else 4:4:4.
    pub(crate) fn for_size(width: usize, height: usize) -> Chroma {
        if width.is_multiple_of(2) && height.is_multiple_of(2) {
            Chroma::C420Jpeg
        } else {
            Chroma::C444
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Chroma::C420Jpeg => "C420jpeg XYSCSS=420JPEG",
            Chroma::C444 => "C444 XYSCSS=444",
        }
    }
}

/// A frame rate as the rational `num/den` the header stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameRate {
    /// Numerator.
    pub num: u32,
    /// Denominator.
    pub den: u32,
}

impl FrameRate {
    /// Frames per second as a float.
    pub fn fps(self) -> f64 {
        f64::from(self.num) / f64::from(self.den)
    }
}

/// The frame rates a `.y4m` header may carry, in frames per second.
pub(crate) const FPS_RANGE: (f64, f64) = (0.001, 10_000.0);

impl std::str::FromStr for FrameRate {
    type Err = Error;
    /// `16`, `12.5` (to 1/1000), `30000/1001`, or the NTSC rates written as
    /// decimals (`23.976`, `29.97`, `59.94`: N·1000/1001 to 0.005 fps).
    fn from_str(s: &str) -> Result<Self> {
        let (lo, hi) = FPS_RANGE;
        let bad = |why: &str| {
            Error::InvalidInput(format!(
                "frame rate `{s}`: {why}; give frames per second from {lo} to {hi} as a number (16, 12.5, 23.976, 29.97) or a ratio (24000/1001)"
            ))
        };
        let (num, den): (u64, u64) = match s.split_once('/') {
            Some((n, d)) => {
                let int = |x: &str| {
                    x.trim()
                        .parse::<u64>()
                        .map_err(|_| bad(&format!("`{}` is not a whole number", x.trim())))
                };
                (int(n)?, int(d)?)
            }
            None => {
                let f: f64 = s.trim().parse().map_err(|_| bad("not a number"))?;
                if !(f.is_finite() && (lo..=hi).contains(&f)) {
                    return Err(bad("out of range"));
                }
                let ntsc = (f * 1.001).round();
                if ntsc >= 1.0 && f.fract() != 0.0 && (f - ntsc / 1.001).abs() < 0.005 {
                    (ntsc as u64 * 1000, 1001)
                } else {
                    ((f * 1000.0).round() as u64, 1000)
                }
            }
        };
        if den == 0 {
            return Err(bad("the denominator is 0"));
        }
        let fps = num as f64 / den as f64;
        if !(lo..=hi).contains(&fps) {
            return Err(bad("out of range"));
        }
        let g = gcd64(num, den);
        let (num, den) = (num / g, den / g);
        match (u32::try_from(num), u32::try_from(den)) {
            (Ok(num), Ok(den)) => Ok(FrameRate { num, den }),
            _ => Err(bad("its numerator or denominator exceeds 4294967295")),
        }
    }
}

fn gcd64(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd64(b, a % b)
    }
}

/// BT.601 full-range `(Y, Cb, Cr)` of RGB in [0, 255] (unrounded).
pub fn rgb_to_ycbcr(r: f32, g: f32, b: f32) -> [f32; 3] {
    [
        0.299 * r + 0.587 * g + 0.114 * b,
        128.0 - 0.168_736 * r - 0.331_264 * g + 0.5 * b,
        128.0 + 0.5 * r - 0.418_688 * g - 0.081_312 * b,
    ]
}

/// Cb (`k` = 1) or Cr (`k` = 2) of a `(Y, Cb, Cr)`.
fn chroma_of([_, cb, cr]: [f32; 3], k: usize) -> f32 {
    if k == 1 {
        cb
    } else {
        cr
    }
}

fn byte(v: f32) -> u8 {
    v.round().clamp(0.0, 255.0) as u8
}

/// A `.y4m` stream: the header at creation, then one `FRAME` per
/// [`Y4mWriter::write_frame`].
pub struct Y4mWriter<W: Write> {
    out: W,
    width: usize,
    height: usize,
    chroma: Chroma,
    range: ImageRange,
    frames: usize,
    /// One frame's planes, reused.
    planes: Vec<u8>,
    /// For errors.
    path: PathBuf,
}

impl Y4mWriter<std::io::BufWriter<std::fs::File>> {
    /// Creates `path` and writes the header (see [`Y4mWriter::new`]).
    pub fn create(
        path: &Path,
        width: usize,
        height: usize,
        rate: FrameRate,
        range: ImageRange,
    ) -> Result<Self> {
        let file = std::fs::File::create(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Y4mWriter::new(
            std::io::BufWriter::new(file),
            path,
            width,
            height,
            rate,
            range,
        )
    }
}

impl<W: Write> Y4mWriter<W> {
    /// Writes the header of `width`×`height` frames at `rate` into `out`;
    /// frames will hold decoder output in `range` (`path` names `out` in errors).
    pub fn new(
        mut out: W,
        path: &Path,
        width: usize,
        height: usize,
        rate: FrameRate,
        range: ImageRange,
    ) -> Result<Self> {
        if width == 0 || height == 0 {
            return Err(Error::InvalidInput(format!(
                "a {width}×{height} video has no pixels"
            )));
        }
        let chroma = Chroma::for_size(width, height);
        let header = format!(
            "YUV4MPEG2 W{width} H{height} F{}:{} Ip A1:1 {} XCOLORRANGE=FULL\n",
            rate.num,
            rate.den,
            chroma.tag()
        );
        out.write_all(header.as_bytes())
            .map_err(|source| Error::Io {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Y4mWriter {
            out,
            width,
            height,
            chroma,
            range,
            frames: 0,
            planes: Vec::new(),
            path: path.to_path_buf(),
        })
    }

    /// The chroma sampling chosen for the frame size.
    pub fn chroma(&self) -> Chroma {
        self.chroma
    }

    /// Frames written so far.
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// Appends one frame of planar RGB `[3, H, W]` floats (the decoder's raw
    /// output: clamped to its range, as the PNGs are).
    pub fn write_frame(&mut self, rgb: &[f32]) -> Result<()> {
        let (w, h) = (self.width, self.height);
        let plane = w * h;
        if rgb.len() != 3 * plane {
            return Err(Error::InvalidInput(format!(
                "a {w}×{h} video frame is 3×{h}×{w} = {} values, got {}",
                3 * plane,
                rgb.len()
            )));
        }
        let (rs, rest) = rgb.split_at(plane);
        let (gs, bs) = rest.split_at(plane);
        let range = self.range;
        let level = |v: f32, ch: usize| -> f32 {
            let unit = match range {
                ImageRange::ZeroToOne => v,
                ImageRange::MinusOneToOne => v / 2.0 + 0.5,
                ImageRange::ImageNet => range.to_unit_at(v, ch),
            };
            // NaN becomes black, as in the PNGs' RGB.
            if unit.is_nan() {
                0.0
            } else {
                unit.clamp(0.0, 1.0) * 255.0
            }
        };
        let pixel = |i: usize| -> [f32; 3] {
            let at = |s: &[f32], ch| level(s.get(i).copied().unwrap_or(0.0), ch);
            [at(rs, 0), at(gs, 1), at(bs, 2)]
        };
        self.planes.clear();
        self.planes.extend(b"FRAME\n");
        for i in 0..plane {
            let [r, g, b] = pixel(i);
            self.planes.push(byte(rgb_to_ycbcr(r, g, b)[0]));
        }
        match self.chroma {
            Chroma::C444 => {
                for k in 1..3 {
                    for i in 0..plane {
                        let [r, g, b] = pixel(i);
                        self.planes.push(byte(chroma_of(rgb_to_ycbcr(r, g, b), k)));
                    }
                }
            }
            Chroma::C420Jpeg => {
                // Chroma is linear in RGB: the mean of the block's chroma.
                for k in 1..3 {
                    for y in (0..h).step_by(2) {
                        for x in (0..w).step_by(2) {
                            let mut sum = 0.0;
                            for i in [
                                y * w + x,
                                y * w + x + 1,
                                (y + 1) * w + x,
                                (y + 1) * w + x + 1,
                            ] {
                                let [r, g, b] = pixel(i);
                                sum += chroma_of(rgb_to_ycbcr(r, g, b), k);
                            }
                            self.planes.push(byte(sum / 4.0));
                        }
                    }
                }
            }
        }
        self.out
            .write_all(&self.planes)
            .map_err(|source| Error::Io {
                path: self.path.clone(),
                source,
            })?;
        self.frames += 1;
        Ok(())
    }

    /// Flushes and returns the writer.
    pub fn finish(mut self) -> Result<W> {
        self.out.flush().map_err(|source| Error::Io {
            path: self.path.clone(),
            source,
        })?;
        Ok(self.out)
    }
}

/// A parsed `.y4m` header and its frame count (for tests and tools).
#[derive(Debug, PartialEq, Eq)]
pub struct Y4mInfo {
    /// Frame width.
    pub width: usize,
    /// Frame height.
    pub height: usize,
    /// Frame rate.
    pub rate: FrameRate,
    /// Chroma sampling.
    pub chroma: Chroma,
    /// Whole frames in the stream.
    pub frames: usize,
}

/// Reads the header of a `.y4m` stream (the tags this writer uses) and
/// counts its frames, checking that each has the right size.
pub fn parse_y4m(bytes: &[u8]) -> Result<Y4mInfo> {
    let bad = |m: String| Error::InvalidInput(format!("not a y4m stream: {m}"));
    let end = bytes
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| bad("no header line".into()))?;
    let header = std::str::from_utf8(bytes.get(..end).unwrap_or_default())
        .map_err(|_| bad("header is not text".into()))?;
    let mut tags = header.split(' ');
    if tags.next() != Some("YUV4MPEG2") {
        return Err(bad("no YUV4MPEG2 signature".into()));
    }
    let (mut width, mut height, mut rate, mut chroma) = (0usize, 0usize, None, Chroma::C420Jpeg);
    for tag in tags {
        // A tag's first character is its key (a non-ASCII one is no known key).
        let (k, v) = tag.split_at_checked(1).unwrap_or(("", tag));
        match k {
            "W" => width = v.parse().map_err(|_| bad(format!("width `{v}`")))?,
            "H" => height = v.parse().map_err(|_| bad(format!("height `{v}`")))?,
            "F" => rate = Some(v.replacen(':', "/", 1).parse::<FrameRate>()?),
            "C" if v == "444" => chroma = Chroma::C444,
            "C" if v.starts_with("420") => chroma = Chroma::C420Jpeg,
            "C" => return Err(bad(format!("chroma `{v}`"))),
            _ => {}
        }
    }
    let rate = rate.ok_or_else(|| bad("no frame rate".into()))?;
    let pixels: usize = width
        .checked_mul(height)
        .filter(|&p| p <= bytes.len())
        .ok_or_else(|| bad(format!("a {width}×{height} frame is larger than the file")))?;
    let frame = match chroma {
        Chroma::C444 => 3 * pixels,
        Chroma::C420Jpeg => pixels + 2 * (width / 2) * (height / 2),
    };
    let mut at = end + 1;
    let mut frames = 0;
    while at < bytes.len() {
        let line = bytes
            .get(at..)
            .and_then(|b| b.iter().position(|&c| c == b'\n'))
            .ok_or_else(|| bad(format!("frame {frames}: no FRAME line")))?;
        if !bytes
            .get(at..at + line)
            .is_some_and(|l| l.starts_with(b"FRAME"))
        {
            return Err(bad(format!("frame {frames}: no FRAME marker")));
        }
        at += line + 1 + frame;
        if at > bytes.len() {
            return Err(bad(format!("frame {frames} is cut short")));
        }
        frames += 1;
    }
    Ok(Y4mInfo {
        width,
        height,
        rate,
        chroma,
        frames,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(w: usize, h: usize, frames: &[Vec<f32>]) -> Vec<u8> {
        let rate: FrameRate = "16".parse().unwrap();
        let mut y4m = Y4mWriter::new(
            Vec::new(),
            Path::new("t.y4m"),
            w,
            h,
            rate,
            ImageRange::ZeroToOne,
        )
        .unwrap();
        for f in frames {
            y4m.write_frame(f).unwrap();
        }
        y4m.finish().unwrap()
    }

    #[test]
    fn header_and_known_colours() {
        // 2×2 frame: red, green, blue, white; then a flat grey frame.
        let mut f = vec![0.0; 12];
        f[0] = 1.0; // R of pixel 0
        f[4 + 1] = 1.0; // G of pixel 1
        f[8 + 2] = 1.0; // B of pixel 2
        for c in 0..3 {
            f[c * 4 + 3] = 1.0; // white pixel 3
        }
        let grey = vec![0.5; 12];
        let bytes = stream(2, 2, &[f, grey]);
        let header = b"YUV4MPEG2 W2 H2 F16:1 Ip A1:1 C420jpeg XYSCSS=420JPEG XCOLORRANGE=FULL\n";
        assert_eq!(&bytes[..header.len()], header);
        let frame = &bytes[header.len()..];
        assert_eq!(&frame[..6], b"FRAME\n");
        // BT.601 full range: red Y 76, green 150, blue 29, white 255.
        assert_eq!(&frame[6..10], &[76, 150, 29, 255]);
        // Chroma: the mean of the 2×2 block's.
        let [_, cb_r, cr_r] = rgb_to_ycbcr(255.0, 0.0, 0.0);
        let [_, cb_g, cr_g] = rgb_to_ycbcr(0.0, 255.0, 0.0);
        let [_, cb_b, cr_b] = rgb_to_ycbcr(0.0, 0.0, 255.0);
        let [_, cb_w, cr_w] = rgb_to_ycbcr(255.0, 255.0, 255.0);
        assert_eq!(frame[10], byte((cb_r + cb_g + cb_b + cb_w) / 4.0));
        assert_eq!(frame[11], byte((cr_r + cr_g + cr_b + cr_w) / 4.0));
        assert_eq!((byte(cb_w), byte(cr_w)), (128, 128));
        assert_eq!((byte(cb_b), byte(cr_r)), (255, 255));
        // Grey 0.5 → 127.5 → Y 128, chroma 128.
        let second = &frame[12..];
        assert_eq!(second, b"FRAME\n\x80\x80\x80\x80\x80\x80");
        let info = parse_y4m(&bytes).unwrap();
        assert_eq!(
            (info.width, info.height, info.frames, info.chroma),
            (2, 2, 2, Chroma::C420Jpeg)
        );
    }

    #[test]
    fn odd_sizes_are_444_and_rates_parse() {
        let bytes = stream(3, 1, &[vec![0.0; 9], vec![2.0; 9], vec![-1.0; 9]]);
        let info = parse_y4m(&bytes).unwrap();
        assert_eq!((info.chroma, info.frames), (Chroma::C444, 3));
        // Out-of-range values clamp: white, then black.
        let frame = 6 + 9;
        let start = bytes.len() - 2 * frame;
        assert_eq!(&bytes[start + 6..start + 9], &[255, 255, 255]);
        assert_eq!(&bytes[start + 9..start + 15], &[128; 6]);
        let r = |s: &str| s.parse::<FrameRate>();
        assert_eq!(r("16").unwrap(), FrameRate { num: 16, den: 1 });
        let rate = |num, den| FrameRate { num, den };
        for (given, want) in [
            ("23.976", rate(24000, 1001)),
            ("29.97", rate(30000, 1001)),
            ("59.94", rate(60000, 1001)),
            ("24000/1001", rate(24000, 1001)),
            ("12.5", rate(25, 2)),
            ("24", rate(24, 1)),
            ("48/2", rate(24, 1)),
            ("0.001", rate(1, 1000)),
            ("10000", rate(10000, 1)),
        ] {
            assert_eq!(r(given).unwrap(), want, "{given}");
        }
        for out in [
            "1e30",
            "4294967296",
            "2.5e-10",
            "10001",
            "1/1001",
            "4294967296/1",
        ] {
            let e = r(out).unwrap_err().to_string();
            assert!(e.contains(out) && e.contains("from 0.001 to 10000"), "{e}");
        }
        assert_eq!(
            r("30000/1001").unwrap(),
            FrameRate {
                num: 30000,
                den: 1001
            }
        );
        for bad in ["0", "-3", "x", "1/0", "nan", "inf", "-1/2", "1.5/2"] {
            assert!(r(bad).is_err(), "{bad}");
        }
        let mut w = Y4mWriter::new(
            Vec::new(),
            Path::new("t.y4m"),
            2,
            2,
            r("16").unwrap(),
            ImageRange::ZeroToOne,
        )
        .unwrap();
        assert!(w.write_frame(&[0.0; 11]).is_err());
        assert!(parse_y4m(b"YUV4MPEG2 W2 H2 F16:1\nFRAME\n\x00").is_err());
    }
}
