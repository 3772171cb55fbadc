//! ABI pins for the kernel interfaces: struct sizes and offsets, full ioctl request numbers and
//! flag values, each against the value written in the shared reference `rknpu-facts.md`
//! (§1.2 table, §1.3 layouts, §1.4 enumerations, §1.7 rocket uapi). A mismatch here means a
//! struct or a number drifted from what the kernel expects. The request numbers are the LP64
//! values from the facts table, so those tests only run on 64-bit targets.

use std::mem::{offset_of, size_of};

use ggml_ork::npu::kif::{self, drm, job_flags, mem_flags, rknpu, rocket, RknpuTask};
use drm::{DRM_COMMAND_BASE as BASE, DRM_IOCTL_TYPE as D};

/// The full request number of an `_IOWR` / `_IOW` DRM ioctl (`dir<<30 | size<<16 | type<<8 | nr`).
macro_rules! rw {
    ($nr:expr, $t:ty) => {
        nix::request_code_readwrite!(D, $nr, size_of::<$t>()) as u64
    };
}
macro_rules! w {
    ($nr:expr, $t:ty) => {
        nix::request_code_write!(D, $nr, size_of::<$t>()) as u64
    };
}

#[test]
fn rknpu_struct_sizes() {
    assert_eq!(size_of::<rknpu::RknpuAction>(), 8);
    assert_eq!(size_of::<rknpu::RknpuSubmit>(), 104);
    assert_eq!(size_of::<rknpu::RknpuMemCreate>(), 48);
    assert_eq!(size_of::<rknpu::RknpuMemMap>(), 16);
    assert_eq!(size_of::<rknpu::RknpuMemDestroy>(), 16);
    assert_eq!(size_of::<rknpu::RknpuMemSync>(), 32);
    assert_eq!(size_of::<rknpu::RknpuSubcoreTask>(), 8);
    assert_eq!(size_of::<RknpuTask>(), 40);
}

#[test]
fn rknpu_submit_offsets() {
    use rknpu::RknpuSubmit as S;
    let got = [
        offset_of!(S, flags),
        offset_of!(S, timeout),
        offset_of!(S, task_start),
        offset_of!(S, task_number),
        offset_of!(S, task_counter),
        offset_of!(S, priority),
        offset_of!(S, task_obj_addr),
        offset_of!(S, iommu_domain_id),
        offset_of!(S, reserved),
        offset_of!(S, task_base_addr),
        offset_of!(S, hw_elapse_time),
        offset_of!(S, core_mask),
        offset_of!(S, fence_fd),
        offset_of!(S, subcore_task),
    ];
    assert_eq!(got, [0, 4, 8, 12, 16, 20, 24, 32, 36, 40, 48, 56, 60, 64]);
}

#[test]
fn rknpu_mem_struct_offsets() {
    use rknpu::{RknpuMemCreate as C, RknpuMemMap as M, RknpuMemSync as Y};
    assert_eq!(
        [
            offset_of!(C, handle),
            offset_of!(C, flags),
            offset_of!(C, size),
            offset_of!(C, obj_addr),
            offset_of!(C, dma_addr),
            offset_of!(C, sram_size),
            offset_of!(C, iommu_domain_id),
            offset_of!(C, core_mask)
        ],
        [0, 4, 8, 16, 24, 32, 40, 44]
    );
    assert_eq!(offset_of!(M, offset), 8);
    assert_eq!(offset_of!(rknpu::RknpuMemDestroy, obj_addr), 8);
    assert_eq!([offset_of!(Y, flags), offset_of!(Y, obj_addr), offset_of!(Y, offset), offset_of!(Y, size)], [0, 8, 16, 24]);
}

#[test]
fn rknpu_task_offsets() {
    assert_eq!(
        [
            offset_of!(RknpuTask, flags),
            offset_of!(RknpuTask, op_idx),
            offset_of!(RknpuTask, enable_mask),
            offset_of!(RknpuTask, int_mask),
            offset_of!(RknpuTask, int_clear),
            offset_of!(RknpuTask, int_status),
            offset_of!(RknpuTask, regcfg_amount),
            offset_of!(RknpuTask, regcfg_offset),
            offset_of!(RknpuTask, regcmd_addr)
        ],
        [0, 4, 8, 12, 16, 20, 24, 28, 32]
    );
}

#[cfg(target_pointer_width = "64")]
#[test]
fn rknpu_request_numbers() {
    use rknpu::nr;
    assert_eq!(rw!(BASE + nr::ACTION, rknpu::RknpuAction), 0xC008_6440);
    assert_eq!(rw!(BASE + nr::SUBMIT, rknpu::RknpuSubmit), 0xC068_6441);
    assert_eq!(rw!(BASE + nr::MEM_CREATE, rknpu::RknpuMemCreate), 0xC030_6442);
    assert_eq!(rw!(BASE + nr::MEM_MAP, rknpu::RknpuMemMap), 0xC010_6443);
    assert_eq!(rw!(BASE + nr::MEM_DESTROY, rknpu::RknpuMemDestroy), 0xC010_6444);
    assert_eq!(rw!(BASE + nr::MEM_SYNC, rknpu::RknpuMemSync), 0xC020_6445);
}

#[cfg(target_pointer_width = "64")]
#[test]
fn drm_core_request_numbers() {
    assert_eq!(w!(drm::DRM_NR_GEM_CLOSE, drm::DrmGemClose), 0x4008_6409);
    assert_eq!(rw!(drm::DRM_NR_VERSION, drm::DrmVersion), 0xC040_6400);
    assert_eq!(size_of::<drm::DrmVersion>(), 64);
}

#[test]
fn rknpu_enumerations() {
    use rknpu::action as a;
    assert_eq!(
        [a::GET_HW_VERSION, a::GET_DRV_VERSION, a::GET_FREQ, a::ACT_RESET, a::GET_IOMMU_EN, a::POWER_ON],
        [0, 1, 2, 6, 18, 20]
    );
    assert_eq!([a::GET_IOMMU_DOMAIN_ID, a::SET_IOMMU_DOMAIN_ID], [24, 25]);
    assert_eq!([rknpu::sync_flags::TO_DEVICE, rknpu::sync_flags::FROM_DEVICE], [1, 2]);
    assert_eq!(rknpu::MIN_DRV_VERSION, rknpu::encode_version(0, 9, 6));
    assert_eq!(rknpu::MIN_DRV_VERSION, 906);
    assert_eq!([job_flags::PC, job_flags::NONBLOCK, job_flags::PINGPONG], [0x1, 0x2, 0x4]);
    assert_eq!(job_flags::PC | job_flags::PINGPONG, 0x5);
    assert_eq!(mem_flags::DATA, 0x403);
    assert_eq!(mem_flags::TASK, 0x40b);
    assert_eq!(mem_flags::ZEROING, 0x20);
    assert_eq!(kif::MAX_DOMAINS, 16);
}

#[test]
fn rocket_struct_layouts() {
    use rocket::*;
    assert_eq!(size_of::<DrmRocketCreateBo>(), 24);
    assert_eq!(
        [offset_of!(DrmRocketCreateBo, size), offset_of!(DrmRocketCreateBo, handle), offset_of!(DrmRocketCreateBo, dma_address), offset_of!(DrmRocketCreateBo, offset)],
        [0, 4, 8, 16]
    );
    assert_eq!(size_of::<DrmRocketPrepBo>(), 16);
    assert_eq!(offset_of!(DrmRocketPrepBo, timeout_ns), 8);
    assert_eq!(size_of::<DrmRocketFiniBo>(), 8);
    assert_eq!(size_of::<DrmRocketTask>(), 8);
    assert_eq!(offset_of!(DrmRocketTask, regcmd_count), 4);
    assert_eq!(size_of::<DrmRocketJob>(), 40);
    assert_eq!(
        [
            offset_of!(DrmRocketJob, tasks),
            offset_of!(DrmRocketJob, in_bo_handles),
            offset_of!(DrmRocketJob, out_bo_handles),
            offset_of!(DrmRocketJob, task_count),
            offset_of!(DrmRocketJob, task_struct_size),
            offset_of!(DrmRocketJob, in_bo_handle_count),
            offset_of!(DrmRocketJob, out_bo_handle_count)
        ],
        [0, 8, 16, 24, 28, 32, 36]
    );
    assert_eq!(size_of::<DrmRocketSubmit>(), 24);
    assert_eq!([offset_of!(DrmRocketSubmit, job_count), offset_of!(DrmRocketSubmit, job_struct_size), offset_of!(DrmRocketSubmit, reserved)], [8, 12, 16]);
}

#[cfg(target_pointer_width = "64")]
#[test]
fn rocket_request_numbers() {
    use rocket::nr;
    assert_eq!(rw!(BASE + nr::CREATE_BO, rocket::DrmRocketCreateBo), 0xC018_6440);
    assert_eq!(w!(BASE + nr::SUBMIT, rocket::DrmRocketSubmit), 0x4018_6441);
    assert_eq!(w!(BASE + nr::PREP_BO, rocket::DrmRocketPrepBo), 0x4010_6442);
    assert_eq!(w!(BASE + nr::FINI_BO, rocket::DrmRocketFiniBo), 0x4008_6443);
}

#[test]
fn rocket_trailer_and_output_register() {
    assert_eq!(rocket::PC_DATA_EXTRA_AMOUNT, 4);
    // rocket finds a job's output BO by the DPU DST_BASE_ADDR write of the register table
    let dst = &ggml_ork::npu::regs::DPU_DST_BASE_ADDR::REG;
    assert_eq!((dst.block.target_op(), dst.offset), (0x1001, 0x4020));
}
