use super::*;

/// Paths in a fresh folder of one test's own, removed on drop (also on failure).
fn scratch() -> impl Fn(&str) -> PathBuf {
    let dir = tempfile::tempdir().unwrap();
    move |name| dir.path().join(name)
}

/// numpy's Fortran-ordered files (a transposed array saved as is) read
/// back in C order.
#[test]
fn fortran_order_npy_reads_in_c_order() {
    let mut header = "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3, 4), }".to_string();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend((header.len() as u16).to_le_bytes());
    bytes.extend(header.as_bytes());
    // Column-major: value at (i, j, k) = 100i + 10j + k stored with i fastest.
    for k in 0..4 {
        for j in 0..3 {
            for i in 0..2 {
                bytes.extend(((100 * i + 10 * j + k) as f32).to_le_bytes());
            }
        }
    }
    let t = parse_npy(&bytes, Path::new("f.npy")).unwrap();
    assert_eq!(t.shape, [2, 3, 4]);
    let want: Vec<f32> = (0..24)
        .map(|n| (100 * (n / 12) + 10 * ((n / 4) % 3) + n % 4) as f32)
        .collect();
    assert_eq!(t.data, want);
}

/// ComfyUI's `.latent`: `latent_tensor` as is with the version marker,
/// times 1 / 0.18215 without it (LoadLatent's rule for old files).
#[test]
fn comfyui_latent_files_follow_load_latent() {
    let tmp = scratch();
    let data: Vec<f32> = (0..16).map(|i| i as f32 * 0.25 - 1.0).collect();
    let write = |name: &str, marker: bool| {
        let p = tmp(name);
        let bytes: &[u8] = bytemuck::cast_slice(&data);
        let t =
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1, 4, 2, 2], bytes)
                .unwrap();
        let empty =
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![0], &[]).unwrap();
        let mut views = vec![(COMFYUI_LATENT_KEY, t)];
        if marker {
            views.push((COMFYUI_VERSION_KEY, empty));
        }
        safetensors::serialize_to_file(views, None, &p).unwrap();
        p
    };
    let new = read_latent_file(&write("new.latent", true), None).unwrap();
    assert!(new.comfyui);
    assert_eq!(
        (new.tensor.shape.as_slice(), &new.tensor.data),
        (&[1, 4, 2, 2][..], &data)
    );
    let old = read_latent_file(&write("old.latent", false), None).unwrap();
    let want: Vec<f32> = data.iter().map(|v| v * (1.0 / 0.18215)).collect();
    assert_eq!(old.tensor.data, want);
    let p = tmp("plain.latent");
    write_safetensors(&p, "latents", &[1, 4, 2, 2], &data).unwrap();
    let e = read_latent_file(&p, None).unwrap_err().to_string();
    assert!(e.contains("latent_tensor"), "{e}");
}

#[test]
fn npy_round_trip_and_rank3_promotion() {
    let tmp = scratch();
    let p = tmp("a.npy");
    let data: Vec<f32> = (0..24).map(|i| i as f32 * 0.5).collect();
    write_npy(&p, &[4, 2, 3], &data).unwrap();
    let t = load_latents(&p, None, 4).unwrap();
    assert_eq!(t.shape, vec![1, 4, 2, 3]);
    assert_eq!(t.data, data);
}

#[test]
fn npy_stream_writes_the_final_shape_then_values() {
    let tmp = scratch();
    let p = tmp("stream.npy");
    let data: Vec<f32> = (0..30).map(|i| i as f32 - 7.25).collect();
    let mut s = NpyStream::create(&p, &[1, 5, 3, 2]).unwrap();
    for chunk in data.chunks(6) {
        s.write(chunk).unwrap();
    }
    s.finish().unwrap();
    let bytes = std::fs::read(&p).unwrap();
    assert_eq!(npy_header_len(&bytes).map(|n| n % 64), Some(0));
    let t = read_npy(&p).unwrap();
    assert_eq!((t.shape, t.data), (vec![1, 5, 3, 2], data));
    let mut short = NpyStream::new(Vec::new(), &p, &[2]).unwrap();
    short.write(&[1.0]).unwrap();
    assert!(short.write(&[1.0, 2.0]).is_err());
    assert!(short
        .finish()
        .unwrap_err()
        .to_string()
        .contains("never written"));
    let one = NpyStream::new(Vec::new(), &p, &[3]).unwrap();
    let mut one = one;
    one.write(&[1.0, 2.0, 3.0]).unwrap();
    let bytes = one.finish().unwrap();
    assert_eq!(parse_npy(&bytes, &p).unwrap().shape, vec![3]);
}

#[test]
fn npy_stream_writes_values_out_of_order() {
    let tmp = scratch();
    // Frames [T, C] arrive in time order; the array is [C, T].
    let p = tmp("stream_at.npy");
    let (t, c) = (4, 3);
    let mut s = NpyStream::create(&p, &[c, t]).unwrap();
    for f in 0..t {
        for ch in 0..c {
            s.write_at((ch * t + f) as u64, &[(10 * ch + f) as f32])
                .unwrap();
        }
    }
    assert!(s.write_at(11, &[0.0, 0.0]).is_err(), "past the end");
    s.finish().unwrap();
    let got = read_npy(&p).unwrap();
    let want: Vec<f32> = (0..c)
        .flat_map(|ch| (0..t).map(move |f| (10 * ch + f) as f32))
        .collect();
    assert_eq!((got.shape, got.data), (vec![c, t], want));
}

#[test]
fn bad_latents_are_clear_errors() {
    let tmp = scratch();
    let p = tmp("video.npy");
    write_npy(&p, &[1, 2, 4, 2, 2], &[0.0; 32]).unwrap();
    let e = load_latents(&p, None, 4).unwrap_err().to_string();
    assert!(
        e.contains("video.npy")
            && e.contains("rank 5")
            && e.contains("image VAE")
            && e.contains("video VAE"),
        "{e}"
    );

    let p = tmp("c.npy");
    write_npy(&p, &[1, 3, 2, 2], &[0.0; 12]).unwrap();
    let e = load_latents(&p, None, 4).unwrap_err().to_string();
    assert!(e.contains("3 channels") && e.contains("expects 4"), "{e}");

    write_npy(&p, &[4, 4], &[0.0; 16]).unwrap();
    let e = load_latents(&p, None, 4).unwrap_err().to_string();
    assert!(e.contains("rank 2"), "{e}");

    let mut v = vec![0.0; 16];
    v[5] = f32::NAN;
    write_npy(&p, &[1, 4, 2, 2], &v).unwrap();
    let e = load_latents(&p, None, 4).unwrap_err().to_string();
    assert!(e.contains("non-finite") && e.contains("index 5"), "{e}");

    write_npy(&p, &[1, 4, 0, 2], &[]).unwrap();
    let e = load_latents(&p, None, 4).unwrap_err().to_string();
    assert!(e.contains("empty"), "{e}");

    let empty = tmp("e.npy");
    std::fs::write(&empty, b"").unwrap();
    let e = load_latents(&empty, None, 4).unwrap_err().to_string();
    assert!(e.contains("empty"), "{e}");

    let junk = tmp("j.safetensors");
    std::fs::write(&junk, b"not a safetensors file at all").unwrap();
    let e = load_latents(&junk, None, 4).unwrap_err().to_string();
    assert!(e.contains("safetensors"), "{e}");

    let other = tmp("x.txt");
    std::fs::write(&other, b"1 2 3").unwrap();
    assert!(load_latents(&other, None, 4)
        .unwrap_err()
        .to_string()
        .contains(".npy or .safetensors"));
    assert!(matches!(
        load_latents(&tmp("missing.npy"), None, 4),
        Err(Error::Io { .. })
    ));
}

/// Found by fuzzing: npyz allocated a header's declared length (up to
/// 4 GiB for a version-2 header) before reading it.
#[test]
fn a_header_longer_than_the_file_is_refused_before_allocation() {
    let mut v2 = b"\x93NUMPY\x02\x00".to_vec();
    v2.extend_from_slice(&u32::MAX.to_le_bytes());
    let e = parse_npy(&v2, Path::new("h.npy")).unwrap_err().to_string();
    assert!(e.contains("h.npy") && e.contains("4294967307 bytes"), "{e}");
    let e = parse_npy(b"\x93NUMPY\x01", Path::new("h.npy"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("at least 10"), "{e}");
}

/// Found by fuzzing: npyz's header parser took minutes on a 100-byte
/// file whose header nests 20 brackets.
#[test]
fn deeply_nested_npy_headers_are_refused_at_once() {
    let tmp = scratch();
    let head = format!("{{'descr': '<f4', 'shape': {} }}\n", "[".repeat(20));
    let mut v = b"\x93NUMPY\x01\x00".to_vec();
    v.extend_from_slice(&(head.len() as u16).to_le_bytes());
    v.extend_from_slice(head.as_bytes());
    let start = std::time::Instant::now();
    let e = parse_npy(&v, Path::new("n.npy")).unwrap_err().to_string();
    assert!(
        e.contains("n.npy") && e.contains("nests brackets 21 deep"),
        "{e}"
    );
    assert!(start.elapsed().as_secs() < 1);
    // A real header still loads.
    let p = tmp("nest-ok.npy");
    write_npy(&p, &[1, 4, 1, 1], &[1.0; 4]).unwrap();
    assert_eq!(read_npy(&p).unwrap().shape, vec![1, 4, 1, 1]);
}

#[test]
fn safetensors_needs_a_key_when_ambiguous() {
    let tmp = scratch();
    use safetensors::tensor::TensorView;
    let p = tmp("two.safetensors");
    let a: Vec<u8> = bytemuck::cast_slice(&[1.0f32; 16]).to_vec();
    let b: Vec<u8> = bytemuck::cast_slice(&[2.0f32; 16]).to_vec();
    let views = vec![
        (
            "a",
            TensorView::new(safetensors::Dtype::F32, vec![1, 4, 2, 2], &a).unwrap(),
        ),
        (
            "b",
            TensorView::new(safetensors::Dtype::F32, vec![1, 4, 2, 2], &b).unwrap(),
        ),
    ];
    safetensors::serialize_to_file(views, None, &p).unwrap();
    let e = load_latents(&p, None, 4).unwrap_err().to_string();
    assert!(e.contains("`key` argument"), "{e}");
    assert_eq!(load_latents(&p, Some("b"), 4).unwrap().data, vec![2.0; 16]);
    assert!(load_latents(&p, Some("c"), 4)
        .unwrap_err()
        .to_string()
        .contains("no tensor named `c`"));
}

#[test]
fn batch_names() {
    let p = Path::new("/x/out.png");
    assert_eq!(batch_paths(p, 1), vec![PathBuf::from("/x/out.png")]);
    assert_eq!(batch_paths(p, 2)[1], PathBuf::from("/x/out_1.png"));
    // No extension: PNG.
    let bare = Path::new("/x/result");
    assert_eq!(batch_paths(bare, 1), vec![PathBuf::from("/x/result.png")]);
    assert_eq!(batch_paths(bare, 2)[0], PathBuf::from("/x/result_0.png"));
}
