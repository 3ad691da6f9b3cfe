#!/bin/sh
# Screenshot of examples/viewer.rs on a virtual X server (lavapipe, no GPU needed):
#   cargo build --example viewer
#   xvfb-run -a -s "-screen 0 800x640x24" assets/screenshots/capture_viewer.sh
# Needs xdotool and ImageMagick (import, convert). Writes assets/screenshots/viewer.png
# (the window's contents after the first present, quantised to 256 colours to stay small).
set -e
cd "$(dirname "$0")/../.."
log=$(mktemp)
WGPU_BACKEND=vulkan target/debug/examples/viewer ../shared/golden/taef2/astronaut.latents.npy \
  --vae ../shared/weights/taef2/decoder.safetensors >"$log" 2>&1 &
pid=$!
# The viewer prints this after presenting its first frame (the decode comes first).
until grep -q "presented the first frame" "$log"; do
  kill -0 $pid 2>/dev/null || { cat "$log"; exit 1; }
  sleep 1
done
sleep 2
win=$(xdotool search --name "wgvae viewer" | head -1)
xprop -id "$win" WM_NAME
grep decoded "$log"
import -window "$win" "$log.png"
convert "$log.png" -strip -colors 256 -define png:compression-level=9 assets/screenshots/viewer.png
kill $pid
rm -f "$log" "$log.png"
