//! The library's errors name its options (`Tiling::max_memory`); the command
//! line shows its users the flags that set them.

/// Library option → the flag that sets it.
const FLAGS: &[(&str, &str)] = &[
    ("`Tiling::max_memory`", "--max-memory"),
    ("`FramesOptions::max_memory`", "--max-memory"),
    ("`Tiling::max_host_memory`", "--max-host-memory"),
    ("`Tiling::tile_size`", "--tile-size"),
    ("`Tiling::overlap`", "--tile-overlap"),
    ("`TileMode::Exact`", "--tile exact"),
    ("`TileMode::Auto`", "--tile auto"),
    ("`EncodeOptions::sample`", "--sample"),
    ("`DecodeOptions::raw_latents`", "--raw-latents"),
    ("`LoadOptions::config`", "--config"),
    ("`LoadOptions::scaling_factor`", "--scaling-factor"),
    ("`LoadOptions::shift_factor`", "--shift-factor"),
    ("`ContextOptions::adapter`", "--adapter"),
    (
        "`ContextOptions::cooperative_matrix`",
        "--cooperative-matrix",
    ),
    ("the `key` argument", "--key NAME"),
    ("`Vae::unpack_tokens`'s size", "--size HxW"),
    ("`DecodeOptions::raw_latents`", "--raw-latents"),
    ("`EncodeOptions::raw_latents`", "--raw-latents"),
    ("load it with `pad` set", "pass --pad"),
];

/// `message` with the library's option names replaced by their flags.
pub(crate) fn in_cli_terms(message: &str) -> String {
    FLAGS.iter().fold(message.to_string(), |m, (option, flag)| {
        m.replace(option, flag)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_become_flags() {
        assert_eq!(
            in_cli_terms("lower `Tiling::tile_size` or raise `Tiling::max_memory`"),
            "lower --tile-size or raise --max-memory"
        );
    }

    /// Every option in the table is named by some library message, and no
    /// library source names a flag (so the table is where they meet).
    #[test]
    fn library_names_options_not_flags() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut library = String::new();
        let mut stack = vec![src.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.starts_with(src.join("cli")) || path == src.join("main.rs") {
                    continue;
                }
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    library.push_str(&std::fs::read_to_string(&path).unwrap());
                }
            }
        }
        for (option, _) in FLAGS {
            assert!(
                library.contains(option),
                "no library message names {option}"
            );
        }
        let code: Vec<&str> = library
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect();
        for flag in [
            "--max-memory",
            "--tile",
            "--key",
            "--pad",
            "--sample",
            "--adapter",
            "--config",
        ] {
            let hits: Vec<&&str> = code.iter().filter(|l| l.contains(flag)).collect();
            assert!(
                hits.is_empty(),
                "library code names the flag {flag}: {hits:?}"
            );
        }
    }
}
