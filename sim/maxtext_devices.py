"""How MaxText 0.2.4's train_rl splits the TPU devices between its trainer and its sampler and lays a mesh over each
(part of the simulation, never imported by plugins/), so the emulated trainer fails where the real one does, before
a model is loaded: a multi-slice run that takes the single-slice branch, or a multislice one with axes it cannot lay.

Sources, MaxText 0.2.4 (the tpu_post_training:0.2.4 image's wheel) unless named:
  utils/model_creation_utils.py:653-750  setup_configs_and_devices: both slice counts -1 (rl.yml:22-23) is the
      single-slice branch (:671-689: every device, split by trainer_/sampler_devices_fraction when there are two VMs
      or more and Pathways); both positive the multislice branch (:691-745: whole slices per role, each slice
      FSDP x tensor, data parallel over the slices); anything else a ValueError (:748)
  configs/types.py:3430-3435, utils/max_utils.py:411-425  num_slices -1 is the number of slices of jax.devices()
  utils/maxtext_utils.py:2154-2237  create_device_mesh: ICI axes over a slice's devices, DCN axes over the slices
  utils/max_utils.py:461-484  fill_unspecified_mesh_axes: one -1 axis filled, the product checked (assertions)
  jax/_src/mesh_utils.py create_hybrid_device_mesh: the devices' slices must be as many as the DCN product, and a
      slice's devices as many as the ICI product (create_device_mesh)
A device is represented by its slice index; devices run slice by slice, as Pathways numbers them.
"""

import math

from .maxtext_outputs import PodFailure

#: configs/base.yml:531 mesh_axes (rl.yml keeps them); an axis's parallelism keys are ici_/dcn_<name>_parallelism,
#: "stage" being the pipeline's (maxtext_utils.py:2188-2236).
MESH_AXES = (
    "diloco",
    "data",
    "stage",
    "fsdp",
    "fsdp_transpose",
    "context",
    "context_usp_ulysses",
    "context_autoregressive",
    "tensor",
    "tensor_sequence",
    "expert",
    "autoregressive",
)
#: The axes base.yml leaves to be filled (-1): FSDP within a slice, data parallelism across slices.
FILLED = {"ici": "fsdp", "dcn": "data"}


def device_split(args, slices, chips_per_slice):
    """The lines train_rl logs while it splits ``slices`` slices of ``chips_per_slice`` chips; raises PodFailure
    (with them) where MaxText raises."""
    lines = []
    try:
        trainer_slices = int(args.get("num_trainer_slices", -1))
        sampler_slices = int(args.get("num_samplers_slices", -1))
        if trainer_slices == -1 and sampler_slices == -1:
            single_slice_branch(args, slices, chips_per_slice, lines)
        elif trainer_slices > 0 and sampler_slices > 0:
            multislice_branch(args, (trainer_slices, sampler_slices), slices, chips_per_slice, lines)
        else:
            raise ValueError("num_trainer_slices and num_samplers_slices should be both -1 or positive")
    except (ValueError, AssertionError) as error:
        message = f"{type(error).__name__}: {error}"
        raise PodFailure(f"train_rl's device split: {message}", lines=lines) from None
    return lines


def single_slice_branch(args, slices, chips, lines):
    """model_creation_utils.py:671-689; each role's config is the run's, num_slices every slice of the job."""
    lines.append("Running on a single slice")
    devices = slice_devices(range(slices), chips)
    trainer, sampler = devices, devices
    vms = len(devices) // int(args.get("chips_per_vm", 4))
    if vms >= 2 and str(args.get("use_pathways", True)).lower() in ("1", "true"):
        lines.append(f"{vms} VMs detected, allocating trainer and sampler devices, and using Pathways.")
        trainer = devices[: int(len(devices) * float(args.get("trainer_devices_fraction", 0.5)))]
        sampler = devices[len(devices) - int(len(devices) * float(args.get("sampler_devices_fraction", 0.5))) :]
        lines.append(f"Using first {len(trainer)} devices as Trainer devices")
        lines.append(f"Using last {len(sampler)} devices as Sampler devices")
    num_slices = int(args.get("num_slices", -1))
    num_slices = slices if num_slices == -1 else num_slices
    device_mesh(args, trainer, num_slices)
    device_mesh(args, sampler, num_slices)


def multislice_branch(args, roles, slices, chips, lines):
    """model_creation_utils.py:691-745: the first num_trainer_slices slices train, the next num_samplers_slices
    sample; a trainer slice is ici_fsdp x ici_tensor, a sampler slice FSDP with the tensor axis derived."""
    lines.append("Running with Multislice")
    trainer_slices, sampler_slices = roles
    if slices < trainer_slices + sampler_slices:
        raise ValueError("Not enough slices for trainer and samplers")
    tensor, fsdp = int(args.get("ici_tensor_parallelism", 1)), chips
    if tensor > 1:
        if chips % tensor:
            raise ValueError(f"trainer_devices_per_slice ({chips}) must be divisible by tensor parallelism ({tensor})")
        given = int(args.get("ici_fsdp_parallelism", -1))
        if given != -1 and given * tensor != chips:
            raise ValueError(
                f"ici_fsdp_parallelism ({given}) * ici_tensor_parallelism ({tensor}) must equal "
                f"devices_per_slice ({chips})"
            )
        fsdp = chips // tensor
    trainer = {"ici_fsdp_parallelism": fsdp, "ici_tensor_parallelism": tensor, "dcn_data_parallelism": trainer_slices}
    sampler = {"ici_fsdp_parallelism": chips, "ici_tensor_parallelism": -1, "dcn_data_parallelism": sampler_slices}
    device_mesh({**args, **trainer}, slice_devices(range(trainer_slices), chips), trainer_slices)
    device_mesh({**args, **sampler}, slice_devices(range(trainer_slices, sum(roles)), chips), sampler_slices)


def slice_devices(indices, chips):
    """The devices of the slices ``indices``, each device its slice's index."""
    return [index for index in indices for _ in range(chips)]


def device_mesh(args, devices, num_slices):
    """maxtext_utils.py:2154-2237 over ``devices`` (their slice indices): the ICI axes fill a slice's share of the
    devices; with several slices the DCN axes fill the slices, which the devices must span, each slice's devices
    being as many as the ICI axes make (jax mesh_utils.create_hybrid_device_mesh). Before it, the role's config
    refuses DCN axes on one slice (configs/types.py:4148-4164)."""
    if abs(math.prod(axis_values(args, "dcn"))) > 1 and not num_slices > 1:
        raise ValueError("DCN parallelism requested but only one slice available.")
    ici = filled_axes(axis_values(args, "ici"), len(devices) // num_slices, "ICI")
    if num_slices > 1:
        dcn = filled_axes(axis_values(args, "dcn"), num_slices, "DCN")
        granules = [devices.count(index) for index in sorted(set(devices))]
        if math.prod(dcn) != len(granules):
            raise ValueError(f"Number of slices {len(granules)} must equal the product of dcn_mesh_shape {dcn}")
        for size in granules:
            if size != math.prod(ici):
                raise ValueError(f"Number of devices {size} must equal the product of mesh_shape {ici}")


def axis_values(args, network):
    """The parallelism of every mesh axis on ``network`` (ici or dcn), as the config sets it."""
    values = []
    for axis in MESH_AXES:
        key = f"{network}_{'pipeline' if axis == 'stage' else axis}_parallelism"
        values.append(int(args.get(key, -1 if FILLED[network] == axis else 1)))
    return values


def filled_axes(values, target, network):
    """max_utils.py:461-484 fill_unspecified_mesh_axes, its assertions' messages."""
    values = list(values)
    if -1 in values:
        assert values.count(-1) == 1, (
            f"Found unspecified values (-1) for more than one {network} parallelism axis. "
            "At most one axis can be unspecified."
        )
        determined = target / math.prod(values) * -1
        assert determined >= 1 and determined.is_integer(), (
            f"Unspecified value unable to be determined with the given {network} parallelism values"
        )
        values[values.index(-1)] = int(determined)
    unit = "slices" if network == "DCN" else "devices per slice"
    assert math.prod(values) == target, (
        f"Number of {unit} {target} does not match the product of the {network} parallelism {math.prod(values)}"
    )
    return values
