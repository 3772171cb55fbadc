//! Physical-device choice, the feature report, and the logical device every resource shares.
//!
//! Choice: the first device whose name contains "Mali" (the RK3588's Mali-G610), unless
//! `ORK_VK_DEVICE` names another one by index (`0`, `1`, …) or by a case-insensitive name
//! substring (`llvmpipe` selects lavapipe). One log line per considered device says what it
//! offers; a device lacking what the shaders need is skipped with one line.
//!
//! What the shaders need is deliberately little: they read weights and activations as 32-bit
//! words and unpack bytes/nibbles with shifts, so 8-bit storage, `shaderInt8` and integer dot
//! product are *reported* (they are the levers for a faster Mali kernel)
//! but not required. Required: Vulkan 1.1, a compute queue and subgroup arithmetic
//! (`subgroupAdd`) in compute shaders, which every Vulkan 1.1 Mali driver reports.

use std::ffi::CStr;
use std::sync::Arc;

use ash::vk;

use super::instance::{InstanceShared, API_VERSION};
use super::VkError;

/// The variable that overrides the device choice (index or name substring), parsed by
/// `crate::config` and passed to [`DeviceWanted::from_value`].
pub const ENV_DEVICE: &str = "ORK_VK_DEVICE";
/// Name substring chosen by default.
pub const DEFAULT_DEVICE_SUBSTRING: &str = "Mali";

/// What a physical device offers, as far as the engine cares.
#[derive(Clone, Debug)]
pub struct DeviceReport {
    pub index: usize,
    pub name: String,
    pub api_version: u32,
    pub device_type: vk::PhysicalDeviceType,
    pub storage_buffer_8bit: bool,
    pub shader_int8: bool,
    pub integer_dot_product: bool,
    pub subgroup_size: u32,
    pub subgroup_arithmetic: bool,
    pub external_memory_host: bool,
    pub max_storage_buffer_range_bytes: u64,
    pub max_workgroup_count_x: u32,
    pub compute_queue_family: Option<u32>,
}

impl DeviceReport {
    /// Requirements not met, as short names (empty = usable).
    pub fn missing(&self) -> Vec<&'static str> {
        let mut m = Vec::new();
        if self.api_version < API_VERSION {
            m.push("Vulkan 1.1");
        }
        if self.compute_queue_family.is_none() {
            m.push("compute queue");
        }
        if !self.subgroup_arithmetic {
            m.push("subgroup arithmetic in compute");
        }
        m
    }

    /// The one-line summary that goes to the log.
    pub fn line(&self) -> String {
        let yn = |b: bool| if b { "yes" } else { "no" };
        format!(
            "vk: device {} '{}' ({:?}, Vulkan {}.{}.{}): storageBuffer8BitAccess={} shaderInt8={} \
             integerDotProduct={} subgroupSize={} subgroupArithmetic={} \
             externalMemoryHost={} maxStorageBufferRange={}MiB",
            self.index,
            self.name,
            self.device_type,
            vk::api_version_major(self.api_version),
            vk::api_version_minor(self.api_version),
            vk::api_version_patch(self.api_version),
            yn(self.storage_buffer_8bit),
            yn(self.shader_int8),
            yn(self.integer_dot_product),
            self.subgroup_size,
            yn(self.subgroup_arithmetic),
            yn(self.external_memory_host),
            self.max_storage_buffer_range_bytes >> 20,
        )
    }
}

fn has_ext(exts: &[vk::ExtensionProperties], name: &CStr) -> bool {
    exts.iter().any(|e| e.extension_name_as_c_str().is_ok_and(|n| n == name))
}

/// Queries one physical device.
fn report(inst: &ash::Instance, pd: vk::PhysicalDevice, index: usize) -> Result<DeviceReport, VkError> {
    // SAFETY: `pd` was returned by `enumerate_physical_devices` on this instance.
    let props = unsafe { inst.get_physical_device_properties(pd) };
    let name = props.device_name_as_c_str().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
    // SAFETY: as above.
    let exts = unsafe { inst.enumerate_device_extension_properties(pd) }.map_err(VkError::call("vkEnumerateDeviceExtensionProperties"))?;
    // SAFETY: as above.
    let families = unsafe { inst.get_physical_device_queue_family_properties(pd) };
    let compute_queue_family = families
        .iter()
        .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
        .map(|i| i as u32);

    let mut r = DeviceReport {
        index,
        name,
        api_version: props.api_version,
        device_type: props.device_type,
        storage_buffer_8bit: false,
        shader_int8: false,
        integer_dot_product: false,
        subgroup_size: 0,
        subgroup_arithmetic: false,
        external_memory_host: has_ext(&exts, ash::ext::external_memory_host::NAME),
        max_storage_buffer_range_bytes: props.limits.max_storage_buffer_range as u64,
        max_workgroup_count_x: props.limits.max_compute_work_group_count[0],
        compute_queue_family,
    };
    if props.api_version < API_VERSION {
        return Ok(r); // features2 is not core on a 1.0 device; it is skipped anyway
    }
    let dot_ext = props.api_version >= vk::API_VERSION_1_3
        || has_ext(&exts, ash::khr::shader_integer_dot_product::NAME);
    let mut f8 = vk::PhysicalDevice8BitStorageFeatures::default();
    let mut fi8 = vk::PhysicalDeviceShaderFloat16Int8Features::default();
    let mut fdot = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default();
    let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut f8).push_next(&mut fi8);
    if dot_ext {
        f2 = f2.push_next(&mut fdot);
    }
    // SAFETY: the chain holds only structures this 1.1+ device knows (the dot-product one only
    // when the device is 1.3 or lists the extension); all outlive the call.
    unsafe { inst.get_physical_device_features2(pd, &mut f2) };
    let mut sg = vk::PhysicalDeviceSubgroupProperties::default();
    let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut sg);
    // SAFETY: core 1.1 query with a 1.1 structure in the chain.
    unsafe { inst.get_physical_device_properties2(pd, &mut p2) };
    r.storage_buffer_8bit = f8.storage_buffer8_bit_access == vk::TRUE;
    r.shader_int8 = fi8.shader_int8 == vk::TRUE;
    r.integer_dot_product = dot_ext && fdot.shader_integer_dot_product == vk::TRUE;
    r.subgroup_size = sg.subgroup_size;
    r.subgroup_arithmetic = sg.supported_stages.contains(vk::ShaderStageFlags::COMPUTE)
        && sg.supported_operations.contains(vk::SubgroupFeatureFlags::ARITHMETIC);
    Ok(r)
}

/// How the caller wants the device chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceWanted {
    /// First device whose name contains this (case-insensitive).
    Name(String),
    /// Device at this index of `vkEnumeratePhysicalDevices`.
    Index(usize),
}

impl DeviceWanted {
    /// From the value of `ORK_VK_DEVICE` (an index or a name substring), else the default
    /// ("Mali").
    pub fn from_value(value: Option<&str>) -> Self {
        match value.map(str::trim) {
            Some(v) if !v.is_empty() => match v.parse::<usize>() {
                Ok(i) => DeviceWanted::Index(i),
                Err(_) => DeviceWanted::Name(v.to_string()),
            },
            _ => DeviceWanted::Name(DEFAULT_DEVICE_SUBSTRING.to_string()),
        }
    }

    fn matches(&self, r: &DeviceReport) -> bool {
        match self {
            DeviceWanted::Index(i) => r.index == *i,
            DeviceWanted::Name(s) => r.name.to_lowercase().contains(&s.to_lowercase()),
        }
    }
}

/// The logical device, its compute queue and what the engine needs to know about it.
/// Every Vulkan object holds an `Arc` to this; dropping it waits idle, destroys the device, then
/// releases the instance.
pub struct DeviceShared {
    pub(crate) device: ash::Device,
    pub(crate) queue: vk::Queue,
    pub(crate) queue_family: u32,
    pub(crate) memory: vk::PhysicalDeviceMemoryProperties,
    pub(crate) report: DeviceReport,
    /// Keeps the instance (and loader) alive until the device is destroyed.
    _instance: Arc<InstanceShared>,
}

impl DeviceShared {
    /// Picks a device (see the module docs) and creates it. `Ok(None)` with one log line when
    /// nothing suitable exists.
    pub fn open(instance: Arc<InstanceShared>, wanted: &DeviceWanted) -> Result<Option<Arc<Self>>, VkError> {
        let inst = &instance.instance;
        // SAFETY: plain query on a live instance.
        let pds = unsafe { inst.enumerate_physical_devices() }.map_err(VkError::call("vkEnumeratePhysicalDevices"))?;
        let mut names = Vec::new();
        let mut chosen = None;
        for (i, &pd) in pds.iter().enumerate() {
            let r = report(inst, pd, i)?;
            names.push(format!("{i}:'{}'", r.name));
            if chosen.is_some() || !wanted.matches(&r) {
                continue;
            }
            let missing = r.missing();
            if missing.is_empty() {
                log::info!("{} -> selected", r.line());
                chosen = Some((pd, r));
            } else {
                log::warn!("{} -> skipped, lacks {}", r.line(), missing.join(", "));
            }
        }
        let Some((pd, report)) = chosen else {
            log::info!(
                "vk: no suitable device matches {wanted:?} among [{}]; set {ENV_DEVICE}=<index|name> \
                 to pick one; GPU decode disabled",
                names.join(", ")
            );
            return Ok(None);
        };
        let family = report.compute_queue_family.expect("checked by missing()");
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default().queue_family_index(family).queue_priorities(&priorities)];
        let info = vk::DeviceCreateInfo::default().queue_create_infos(&queues);
        // SAFETY: `pd` belongs to `inst`; `info` and its arrays outlive the call.
        let device = unsafe { inst.create_device(pd, &info, None) }.map_err(VkError::call("vkCreateDevice"))?;
        // SAFETY: queue 0 of `family` was requested above.
        let queue = unsafe { device.get_device_queue(family, 0) };
        // SAFETY: plain query.
        let memory = unsafe { inst.get_physical_device_memory_properties(pd) };
        Ok(Some(Arc::new(Self { device, queue, queue_family: family, memory, report, _instance: instance })))
    }

    /// Index of the first memory type in `type_bits` having all of `required`, preferring one that
    /// also has all of `preferred`.
    pub fn memory_type(&self, type_bits: u32, required: vk::MemoryPropertyFlags, preferred: vk::MemoryPropertyFlags) -> Option<u32> {
        let types = &self.memory.memory_types[..self.memory.memory_type_count as usize];
        let ok = |i: usize, f: vk::MemoryPropertyFlags| type_bits & (1 << i) != 0 && types[i].property_flags.contains(f);
        (0..types.len())
            .find(|&i| ok(i, required | preferred))
            .or_else(|| (0..types.len()).find(|&i| ok(i, required)))
            .map(|i| i as u32)
    }
}

impl Drop for DeviceShared {
    fn drop(&mut self) {
        // SAFETY: every child object holds an Arc to us, so all are destroyed by now; waiting
        // idle first covers work a failed call may have left queued.
        unsafe {
            let _ = self.device.device_wait_idle();
            self.device.destroy_device(None);
        }
    }
}
