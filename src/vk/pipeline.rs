//! Descriptor-set layouts, the shared pipeline layout and one compute pipeline per shader.
//!
//! Every GEMV pipeline uses the same layout: set 0 = the weight (binding 0: the weight bytes,
//! binding 1: per-channel scales, int8 only; the 4-bit kernels get the weight buffer bound
//! twice), set 1 = the engine's I/O arena (binding 0), plus [`GemvPush`] push constants. One
//! layout means a weight's descriptor set is built once at upload and the arena's once per
//! growth.

use std::io::Cursor;
use std::sync::Arc;

use ash::vk;

use super::device::DeviceShared;
use super::shaders::{ShaderId, GEMV_PUSH_BYTES};
use super::VkError;

/// Layouts and pipelines; destroyed in reverse creation order by `Drop`.
pub struct Pipelines {
    pub(crate) weight_set_layout: vk::DescriptorSetLayout,
    pub(crate) io_set_layout: vk::DescriptorSetLayout,
    pub(crate) layout: vk::PipelineLayout,
    /// Indexed by `ShaderId as usize`.
    pipelines: Vec<vk::Pipeline>,
    dev: Arc<DeviceShared>,
}

fn storage_binding(binding: u32) -> vk::DescriptorSetLayoutBinding<'static> {
    vk::DescriptorSetLayoutBinding::default()
        .binding(binding)
        .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
        .descriptor_count(1)
        .stage_flags(vk::ShaderStageFlags::COMPUTE)
}

impl Pipelines {
    pub fn new(dev: &Arc<DeviceShared>) -> Result<Self, VkError> {
        let d = &dev.device;
        let mut this = Self {
            weight_set_layout: vk::DescriptorSetLayout::null(),
            io_set_layout: vk::DescriptorSetLayout::null(),
            layout: vk::PipelineLayout::null(),
            pipelines: Vec::new(),
            dev: dev.clone(),
        };
        let wb = [storage_binding(0), storage_binding(1)];
        let ib = [storage_binding(0)];
        let set_layout = |b: &[vk::DescriptorSetLayoutBinding<'_>]| {
            // SAFETY: valid device, the create info lives across the call; on error `this`
            // (partially filled) destroys what was created.
            unsafe { d.create_descriptor_set_layout(&vk::DescriptorSetLayoutCreateInfo::default().bindings(b), None) }
                .map_err(VkError::call("vkCreateDescriptorSetLayout"))
        };
        this.weight_set_layout = set_layout(&wb)?;
        this.io_set_layout = set_layout(&ib)?;
        let sets = [this.weight_set_layout, this.io_set_layout];
        let push = [vk::PushConstantRange::default().stage_flags(vk::ShaderStageFlags::COMPUTE).offset(0).size(GEMV_PUSH_BYTES)];
        let info = vk::PipelineLayoutCreateInfo::default().set_layouts(&sets).push_constant_ranges(&push);
        // SAFETY: as above.
        this.layout = unsafe { d.create_pipeline_layout(&info, None) }.map_err(VkError::call("vkCreatePipelineLayout"))?;

        for id in ShaderId::ALL {
            debug_assert_eq!(this.pipelines.len(), id as usize);
            let code = ash::util::read_spv(&mut Cursor::new(id.spirv())).map_err(|e| VkError::BadSpirv { shader: id.name(), detail: e.to_string() })?;
            // SAFETY: `code` is SPIR-V produced by glslc from our sources (checked by the
            // spirv-fresh test); the module is destroyed right after pipeline creation.
            let module = unsafe { d.create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&code), None) }
                .map_err(VkError::call("vkCreateShaderModule"))?;
            let stage = vk::PipelineShaderStageCreateInfo::default()
                .stage(vk::ShaderStageFlags::COMPUTE)
                .module(module)
                .name(c"main");
            let info = [vk::ComputePipelineCreateInfo::default().stage(stage).layout(this.layout)];
            // SAFETY: valid module and layout; the module may be destroyed once the pipeline
            // exists (or creation failed).
            let created = unsafe { d.create_compute_pipelines(vk::PipelineCache::null(), &info, None) };
            // SAFETY: no pipeline creation is using the module any more.
            unsafe { d.destroy_shader_module(module, None) };
            let p = created.map_err(|(_, result)| VkError::Call { call: "vkCreateComputePipelines", result })?;
            this.pipelines.push(p[0]);
        }
        Ok(this)
    }

    pub fn get(&self, id: ShaderId) -> vk::Pipeline {
        self.pipelines[id as usize]
    }
}

impl Drop for Pipelines {
    fn drop(&mut self) {
        let d = &self.dev.device;
        // SAFETY: no command buffer using these is pending (the engine waits on every submit);
        // reverse creation order; destroying null handles is a no-op.
        unsafe {
            for &p in self.pipelines.iter().rev() {
                d.destroy_pipeline(p, None);
            }
            d.destroy_pipeline_layout(self.layout, None);
            d.destroy_descriptor_set_layout(self.io_set_layout, None);
            d.destroy_descriptor_set_layout(self.weight_set_layout, None);
        }
    }
}
