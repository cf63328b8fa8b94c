"""Visible-device mapping: the CUDA and ROCm runtime rules."""

from __future__ import annotations

from maxinstr.sample.devices import MigInstance, PhysicalGpu, amd_visible, nvidia_visible

U = ["GPU-1a2b3c4d-0000-1111-2222-333333333333", "GPU-1a2b9999-0000-1111-2222-333333333333",
     "GPU-77777777-0000-1111-2222-333333333333", "GPU-88888888-0000-1111-2222-333333333333"]
GPUS = [PhysicalGpu(index=i, uuid=u, name="NVIDIA H200") for i, u in enumerate(U)]


def pick(env, gpus=GPUS):
    v = nvidia_visible(gpus, env)
    return [(g.visible_index, g.physical_index) for g in v.gpus], v


def test_unset_means_all_and_empty_means_none():
    assert pick({})[0] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert pick({"CUDA_VISIBLE_DEVICES": ""})[0] == []
    assert pick({"CUDA_VISIBLE_DEVICES": "-1"})[0] == []


def test_indices_reorder_and_renumber():
    got, v = pick({"CUDA_VISIBLE_DEVICES": "3, 1"})
    assert got == [(0, 3), (1, 1)] and v.source == "CUDA_VISIBLE_DEVICES=3, 1" and v.notes == []


def test_list_ends_at_first_invalid_entry():
    got, v = pick({"CUDA_VISIBLE_DEVICES": "2,7,0"})
    assert got == [(0, 2)] and "'7'" in v.notes[0]
    got, v = pick({"CUDA_VISIBLE_DEVICES": "1,1,0"})
    assert got == [(0, 1)] and "repeated" in v.notes[0]


def test_uuid_prefixes_must_be_unique():
    assert pick({"CUDA_VISIBLE_DEVICES": "GPU-7777"})[0] == [(0, 2)]
    assert pick({"CUDA_VISIBLE_DEVICES": "gpu-88888888-0000-1111-2222-333333333333,0"})[0] == [(0, 3), (1, 0)]
    got, v = pick({"CUDA_VISIBLE_DEVICES": "GPU-1a2b,2"})  # matches two GPUs
    assert got == [] and "ambiguous" in v.notes[0]


def test_mig_instances_by_uuid_and_legacy_form():
    mig = (MigInstance("MIG-aaaa1111-2222-3333-4444-555555555555", gpu_instance_id=1, compute_instance_id=0, index=0),
           MigInstance("MIG-bbbb1111-2222-3333-4444-555555555555", gpu_instance_id=2, compute_instance_id=0, index=1))
    gpus = [PhysicalGpu(0, U[0], "NVIDIA H200", mig), GPUS[1]]
    v = nvidia_visible(gpus, {"CUDA_VISIBLE_DEVICES": "MIG-bbbb1111"})
    assert [(g.physical_index, g.uuid, g.mig.index) for g in v.gpus] == [(0, mig[1].uuid, 1)]
    v = nvidia_visible(gpus, {"CUDA_VISIBLE_DEVICES": f"MIG-{U[0]}/1/0"})
    assert [g.mig.uuid for g in v.gpus] == [mig[0].uuid]
    v = nvidia_visible(gpus, {"CUDA_VISIBLE_DEVICES": f"MIG-{U[0]}/9/0"})
    assert v.gpus == [] and "no MIG instance" in v.notes[0]


def test_mixed_gpu_kinds_warn_about_cuda_order():
    gpus = [PhysicalGpu(0, U[0], "NVIDIA H200"), PhysicalGpu(1, U[1], "NVIDIA L4")]
    assert nvidia_visible(gpus, {}).notes and "PCI_BUS_ID" in nvidia_visible(gpus, {}).notes[0]
    assert nvidia_visible(gpus, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}).notes == []


def test_rocr_filters_then_hip_indexes_what_is_left():
    amd = [PhysicalGpu(i, f"GPU-{i:016x}") for i in range(4)]
    v = amd_visible(amd, {"ROCR_VISIBLE_DEVICES": "1,2,3", "HIP_VISIBLE_DEVICES": "2,0"})
    assert [(g.visible_index, g.physical_index) for g in v.gpus] == [(0, 3), (1, 1)]
    v = amd_visible(amd, {"ROCR_VISIBLE_DEVICES": "GPU-0000000000000002"})
    assert [g.physical_index for g in v.gpus] == [2]
    # HIP honours CUDA_VISIBLE_DEVICES too, but HIP_VISIBLE_DEVICES wins
    v = amd_visible(amd, {"CUDA_VISIBLE_DEVICES": "3"})
    assert [g.physical_index for g in v.gpus] == [3]
    v = amd_visible(amd, {"CUDA_VISIBLE_DEVICES": "3", "HIP_VISIBLE_DEVICES": "0"})
    assert [g.physical_index for g in v.gpus] == [0] and v.source == "HIP_VISIBLE_DEVICES=0"
    assert amd_visible(amd, {"ROCR_VISIBLE_DEVICES": ""}).gpus == []
