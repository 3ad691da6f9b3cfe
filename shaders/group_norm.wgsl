// GroupNorm (PyTorch semantics: biased variance, eps inside the sqrt) in
// four entry points, one per pipeline (the flag PARTIALS / COMBINE / FOLD / APPLY
// picks the bindings and entry):
//
//   partials  x [N, C, H, W] -> scratch [N, G, S, 4] = (count, mean, M2, 0)
//             One workgroup per (n, g, chunk of CHUNK = WG * ITEMS elements of
//             the group), so large images use many workgroups. Each invocation
//             takes ITEMS values (stride WG, coalesced) in batches of SUB,
//             computes each batch's mean and M2 exactly from registers
//             (two-pass) and merges batches, then invocations, with Chan's
//             formula. Partials land in slots
//             [slot_offset, slot_offset + slots) of each (n, g) row of S slots,
//             so several tiles' partials can share one scratch and be combined.
//             With REGION only the rectangle [y0, y0+rh) x [x0, x0+rw) of each
//             plane counts (a tile's own pixels, without its halo).
//   combine   scratch -> affine [N, C, 2] = (gamma*rstd, beta - mean*gamma*rstd)
//             One workgroup per (n, g) merges its first `slots` partials (Chan).
//   fold      scratch -> scratch: merges each (n, g) row's first `slots`
//             partials into its slot 0, so a bounded scratch takes the
//             partials of any number of tiles (each row is one workgroup's:
//             every read precedes workgroup_merge's barriers, the write follows).
//   apply     out = act(x * affine[n,c,0] + affine[n,c,1]); out may alias x.
//             Workgroups tile one plane each (no per-element division).
//
// Storage type T (f32 or f16) is an alias from the key; statistics are f32.
// All storage is read_write: pooled tensors share buffers (see BindingKind).

struct Params {
    groups_total: u32,   // N * G
    groups: u32,         // G
    channels: u32,       // C
    cpg: u32,            // channels per group
    plane: u32,          // H * W
    width: u32,          // W
    y0: u32,             // REGION origin and size
    x0: u32,
    rh: u32,
    rw: u32,
    group_len: u32,      // elements of one (n, g) this dispatch covers
    slots: u32,          // chunks per (n, g) this dispatch writes
    slot_offset: u32,    // first slot written
    slot_capacity: u32,  // S: slots per (n, g) row of the scratch
    eps: f32,
    planes: u32,         // N * C
}

@group(0) @binding(0) var<uniform> p: Params;

// (count, mean, M2) of the union of two disjoint sets (Chan et al.).
fn chan(a: vec3<f32>, b: vec3<f32>) -> vec3<f32> {
    let n = a.x + b.x;
    if b.x == 0.0 { return a; }
    if a.x == 0.0 { return b; }
    let delta = b.y - a.y;
    let fb = b.x / n;
    return vec3<f32>(n, a.y + delta * fb, a.z + b.z + delta * delta * a.x * fb);
}

var<workgroup> sh_stats: array<vec3<f32>, 2u * WG>;

// Merges every invocation's stats, 8 per step, each level written after the
// previous one (no in-place hazards, one barrier per level: barriers are what
// software rasterisers pay for). Returns the merged stats (to every invocation).
fn workgroup_merge(li: u32, mine: vec3<f32>) -> vec3<f32> {
    sh_stats[li] = mine;
    workgroupBarrier();
    var in_off = 0u;
    for (var width = WG; width > 1u; width = (width + 7u) / 8u) {
        let parts = (width + 7u) / 8u;
        let out_off = in_off + width;
        if li < parts {
            var acc = sh_stats[in_off + li * 8u];
            for (var r = 1u; r < 8u; r++) {
                if li * 8u + r < width {
                    acc = chan(acc, sh_stats[in_off + li * 8u + r]);
                }
            }
            sh_stats[out_off + li] = acc;
        }
        in_off = out_off;
        workgroupBarrier();
    }
    return sh_stats[in_off];
}

#ifdef PARTIALS
#storage x 1 read
@group(0) @binding(2) var<storage, read_write> scratch: array<vec4<f32>>;

// Address of the e-th element of group (n, g)'s covered elements.
fn element_address(ng: u32, e: u32) -> u32 {
#ifdef REGION
    let n = ng / p.groups;
    let g = ng - n * p.groups;
    let area = p.rh * p.rw;
    let c = e / area;
    let rem = e - c * area;
    let y = rem / p.rw;
    let xx = rem - y * p.rw;
    return (n * p.channels + g * p.cpg + c) * p.plane + (p.y0 + y) * p.width + p.x0 + xx;
#else
    // A group's channels are contiguous: the group is one span.
    return ng * p.group_len + e;
#endif
}

@compute @workgroup_size(WG)
fn partials(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) li: u32) {
    let wid = wg.x + wg.y * nwg.x;
    // Uniform per workgroup, so the early return keeps barriers uniform.
    if wid >= p.groups_total * p.slots { return; }
    let ng = wid / p.slots;
    let chunk = wid - ng * p.slots;
    let start = chunk * (WG * ITEMS);
    let end = min(start + WG * ITEMS, p.group_len);

    // Batches of SUB values: exact two-pass mean / M2 from registers, merged
    // into the running stats with Chan's formula (one division per batch).
    var run = vec3<f32>(0.0);
    for (var b0 = 0u; b0 < ITEMS; b0 += SUB) {
        var vals: array<f32, SUB>;
        var count = 0u;
        var sum = 0.0;
        for (var t = 0u; t < SUB; t++) {
            let e = start + (b0 + t) * WG + li;
            var v = 0.0;
            if e < end {
                v = x_ld(element_address(ng, e));
                count += 1u;
            }
            vals[t] = v;
            sum += v;
        }
        if count == 0u { break; }
        let cnt = f32(count);
        let mean = sum / cnt;
        var m2 = 0.0;
        for (var t = 0u; t < SUB; t++) {
            if start + (b0 + t) * WG + li < end {
                let d = vals[t] - mean;
                m2 += d * d;
            }
        }
        run = chan(run, vec3<f32>(cnt, mean, m2));
    }
    let s = workgroup_merge(li, run);
    if li == 0u {
        scratch[ng * p.slot_capacity + p.slot_offset + chunk] = vec4<f32>(s, 0.0);
    }
}
#endif

#ifndef PARTIALS
#ifndef APPLY
// COMBINE and FOLD: one workgroup per (n, g) row of the scratch.
@group(0) @binding(1) var<storage, read_write> scratch: array<vec4<f32>>;

// The merge of row ng's first p.slots partials (to every invocation).
fn merged_row(ng: u32, li: u32) -> vec3<f32> {
    var acc = vec3<f32>(0.0);
    for (var s = li; s < p.slots; s += WG) {
        acc = chan(acc, scratch[ng * p.slot_capacity + s].xyz);
    }
    return workgroup_merge(li, acc);
}
#endif
#endif

#ifdef COMBINE
@group(0) @binding(2) var<storage, read_write> gamma: array<f32>;
@group(0) @binding(3) var<storage, read_write> beta: array<f32>;
@group(0) @binding(4) var<storage, read_write> affine: array<vec2<f32>>;

@compute @workgroup_size(WG)
fn combine(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) li: u32) {
    let ng = wg.x + wg.y * nwg.x;
    if ng >= p.groups_total { return; }
    let total = merged_row(ng, li);
    let var_biased = select(0.0, total.z / total.x, total.x > 0.0);
    let mr = vec2<f32>(total.y, 1.0 / sqrt(max(var_biased, 0.0) + p.eps));
    let n = ng / p.groups;
    let g = ng - n * p.groups;
    for (var j = li; j < p.cpg; j += WG) {
        let c = g * p.cpg + j;
        let scale = gamma[c] * mr.y;
        affine[n * p.channels + c] = vec2<f32>(scale, beta[c] - mr.x * scale);
    }
}
#endif

#ifdef FOLD
@compute @workgroup_size(WG)
fn fold(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let ng = wg.x + wg.y * nwg.x;
    if ng >= p.groups_total { return; }
    let total = merged_row(ng, li);
    if li == 0u {
        scratch[ng * p.slot_capacity] = vec4<f32>(total, 0.0);
    }
}
#endif

#ifdef APPLY
// x may be out itself (in place).
#storage x 1 shared
@group(0) @binding(2) var<storage, read_write> affine: array<vec2<f32>>;
#storage out 3 write

fn activate(v: f32) -> f32 {
    switch ACT {
        case 1u: { return v / (1.0 + exp(-v)); }
        case 2u: { return max(v, 0.0); }
        default: { return v; }
    }
}

@compute @workgroup_size(WG)
fn apply(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) li: u32) {
    let plane_index = wg.y + wg.z * nwg.y;
    if plane_index >= p.planes { return; }
    let ab = affine[plane_index];
    let base = plane_index * p.plane;
    let start = wg.x * (WG * ITEMS);
    for (var t = 0u; t < ITEMS; t++) {
        let e = start + t * WG + li;
        if e < p.plane {
            out_st(base + e, activate(x_ld(base + e) * ab.x + ab.y));
        }
    }
}
#endif
