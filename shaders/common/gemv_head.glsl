// Shared declarations of the decode GEMV family (gemv_*.comp). Mirrored on the Rust side by
// `src/vk/shaders.rs` (`GemvPush`, `WG_SIZE`, `MAX_M`): change both together.
//
// Work split: a workgroup owns `pc.rows_per_wg` consecutive weight rows (output channels);
// each subgroup takes rows gl_SubgroupID, + gl_NumSubgroups, … of them, its lanes stride over
// K, and subgroupAdd reduces: no shared memory, no barriers (barriers are costly on lavapipe,
// and a Mali-G610 subgroup is 16 lanes). The host sets rows_per_wg = WG / subgroupSize, but the
// row loop is correct for any actual subgroup size.
//
// Set 1 is the engine's I/O arena, one storage buffer seen as 32-bit words: activations,
// activation scales and outputs of every job of a submit live there at word offsets passed in
// the push constants (f32 values travel as their bit patterns).
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

#define WG 64       // invocations per workgroup (one-dimensional)
#define MAX_M 4     // activation rows handled by one dispatch

layout(local_size_x = WG) in;

layout(push_constant) uniform Push {
    uint n;           // weight rows = output channels
    uint k;           // reduction length (elements)
    uint row_words;   // weight row stride in 32-bit words (int8: padded K / 4)
    uint m;           // activation rows, 1..MAX_M
    uint x_off;       // word offset of x[0][0] in io
    uint x_stride;    // words between consecutive activation rows
    uint xs_off;      // word offset of the per-row activation scales (int8 kernel only)
    uint y_off;       // word offset of y[0][0] in io; y is [m, n] row-major f32
    uint rows_per_wg; // weight rows owned by one workgroup
} pc;

layout(set = 1, binding = 0) buffer Io { uint io[]; };

// First row of this workgroup; dispatches wider than maxComputeWorkGroupCount[0] spill into y.
uint first_row() {
    return (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * pc.rows_per_wg;
}

uint end_row() {
    return min(pc.n, first_row() + pc.rows_per_wg);
}

float io_f32(uint word) {
    return uintBitsToFloat(io[word]);
}
