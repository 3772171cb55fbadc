//! Host-visible storage buffers, persistently mapped.
//!
//! On the RK3588 all memory is one LPDDR pool (UMA), so weights live in host-visible memory and
//! are written once through the mapping; there is no staging copy. Coherent memory is required
//! (the spec guarantees such a type exists among the host-visible ones), so no flush/invalidate
//! calls are needed; `HOST_CACHED` is preferred where the host reads results back.

use std::sync::Arc;

use ash::vk;

use super::device::DeviceShared;
use super::VkError;

/// What a buffer is for; decides the memory-type preference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferUse {
    /// Written once by the host, read by shaders (prefers `DEVICE_LOCAL` too).
    Weights,
    /// Written and read back by the host every call (prefers `HOST_CACHED`).
    Io,
}

/// A storage buffer with its own memory, mapped for its whole life.
pub struct HostBuffer {
    pub(crate) buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    mapped: *mut u8,
    size_bytes: usize,
    dev: Arc<DeviceShared>,
}

// SAFETY: the mapping is plain memory owned by this object; `&mut self` is required to write it
// and the owners only do so while no GPU work that uses it is in flight (engine mutex + fence).
unsafe impl Send for HostBuffer {}
// SAFETY: shared references give read access only (see `as_bytes`).
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Creates a buffer of `size_bytes` (rounded up to 4, at least 4) bytes.
    pub fn new(dev: &Arc<DeviceShared>, size_bytes: usize, usage: BufferUse) -> Result<Self, VkError> {
        let size_bytes = size_bytes.max(4).next_multiple_of(4);
        let d = &dev.device;
        let info = vk::BufferCreateInfo::default()
            .size(size_bytes as u64)
            .usage(vk::BufferUsageFlags::STORAGE_BUFFER)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: valid device and create info.
        let buffer = unsafe { d.create_buffer(&info, None) }.map_err(VkError::call("vkCreateBuffer"))?;
        // From here on, a failure must destroy what exists; a half-built Self does that.
        let mut this = Self { buffer, memory: vk::DeviceMemory::null(), mapped: std::ptr::null_mut(), size_bytes, dev: dev.clone() };
        // SAFETY: `buffer` is live.
        let req = unsafe { d.get_buffer_memory_requirements(buffer) };
        let required = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        let preferred = match usage {
            BufferUse::Weights => vk::MemoryPropertyFlags::DEVICE_LOCAL,
            BufferUse::Io => vk::MemoryPropertyFlags::HOST_CACHED,
        };
        let type_index = dev
            .memory_type(req.memory_type_bits, required, preferred)
            .ok_or(VkError::NoMemoryType { what: "host-visible coherent buffer", type_bits: req.memory_type_bits })?;
        let alloc = vk::MemoryAllocateInfo::default().allocation_size(req.size).memory_type_index(type_index);
        // SAFETY: valid allocate info.
        this.memory = unsafe { d.allocate_memory(&alloc, None) }.map_err(VkError::call("vkAllocateMemory"))?;
        // SAFETY: fresh buffer and memory of a compatible type and sufficient size.
        unsafe { d.bind_buffer_memory(buffer, this.memory, 0) }.map_err(VkError::call("vkBindBufferMemory"))?;
        // SAFETY: host-visible memory, mapped once, unmapped in Drop.
        this.mapped = unsafe { d.map_memory(this.memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()) }.map_err(VkError::call("vkMapMemory"))?
            .cast();
        Ok(this)
    }

    /// Size in bytes (a multiple of 4).
    pub fn size_bytes(&self) -> usize {
        self.size_bytes
    }

    /// The mapping as bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `mapped` covers `size_bytes` bytes for the life of self; the GPU only writes
        // Io buffers, and the engine reads them only after the fence wait.
        unsafe { std::slice::from_raw_parts(self.mapped, self.size_bytes) }
    }

    /// The mapping as mutable bytes. Callers ensure no GPU work using the buffer is in flight.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `as_bytes`, and `&mut self` makes the host access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.mapped, self.size_bytes) }
    }

    /// The mapping as 32-bit words (the mapping is at least 4-byte aligned:
    /// `minMemoryMapAlignment` ≥ 64).
    pub fn as_words_mut(&mut self) -> &mut [u32] {
        bytemuck::cast_slice_mut(self.as_bytes_mut())
    }

    /// The mapping as 32-bit words, read-only.
    pub fn as_words(&self) -> &[u32] {
        bytemuck::cast_slice(self.as_bytes())
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        let d = &self.dev.device;
        // SAFETY: owned objects, no GPU work in flight (owners wait on their fence), destroyed in
        // reverse creation order; null handles are skipped.
        unsafe {
            if !self.mapped.is_null() {
                d.unmap_memory(self.memory);
            }
            d.destroy_buffer(self.buffer, None);
            if self.memory != vk::DeviceMemory::null() {
                d.free_memory(self.memory, None);
            }
        }
    }
}
