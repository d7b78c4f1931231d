"""Protocol-buffer message classes built at run time from a short field list.

easyfit reads ``tf.train.Example`` records (TFRecord) with the ``protobuf`` runtime; the message
classes are built here from the published ``.proto`` definitions, in a private descriptor pool,
so neither TensorFlow nor generated code is needed (and nothing clashes with them if present).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from google.protobuf.message import Message

__all__ = ["build_messages", "caffe2_messages", "tf_example"]

#: ``(name, number, type, label, message type or None)``: type is a ``FieldDescriptorProto``
#: type name without ``TYPE_`` (``"BYTES"``, ``"INT64"``, ``"MESSAGE"``, ...), label one of
#: ``"optional"``, ``"repeated"``, ``"packed"`` (repeated, packed) or ``"map"`` (then the type is
#: the value type, keys are strings).
Field = tuple[str, int, str, str, "str | None"]


def build_messages(
    file_name: str,
    package: str,
    messages: Mapping[str, Sequence[Field]],
    syntax: str = "proto2",
    oneofs: Mapping[str, str] | None = None,
) -> dict:
    """Message classes for ``messages`` (``{name: fields}``), by name.

    Args:
        file_name: the ``.proto`` file name the descriptors claim (unique per pool).
        package: the proto package (``"tensorflow"``).
        messages: fields of each message, in the order of the ``.proto`` file.
        syntax: ``"proto2"`` or ``"proto3"``.
        oneofs: ``{message: oneof name}``: every field of that message is in the one oneof.

    Example:
        >>> from easyfit.data.protos import build_messages
        >>> fields = [("a", 1, "INT64", "optional", None)]
        >>> m = build_messages("pair.proto", "demo", {"Pair": fields})
        >>> m["Pair"](a=3).SerializeToString()
        b'\\x08\\x03'
    """
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FileDescriptorProto(name=file_name, package=package, syntax=syntax)
    fd = descriptor_pb2.FieldDescriptorProto
    for name, fields in messages.items():
        msg = fdp.message_type.add(name=name)
        oneof = (oneofs or {}).get(name)
        if oneof:
            msg.oneof_decl.add(name=oneof)
        for fname, number, ftype, label, type_name in fields:
            kind = getattr(fd, f"TYPE_{ftype}")
            ref = f".{package}.{type_name}" if type_name else None
            if label == "map":
                entry = msg.nested_type.add(name=fname.capitalize() + "Entry")
                entry.options.map_entry = True
                entry.field.add(name="key", number=1, type=fd.TYPE_STRING, label=fd.LABEL_OPTIONAL)
                entry.field.add(name="value", number=2, type=kind, label=fd.LABEL_OPTIONAL, type_name=ref)
                kind, ref = fd.TYPE_MESSAGE, f".{package}.{name}.{entry.name}"
            field = msg.field.add(
                name=fname,
                number=number,
                type=kind,
                type_name=ref,
                label=fd.LABEL_OPTIONAL if label == "optional" else fd.LABEL_REPEATED,
            )
            if label == "packed":
                field.options.packed = True
            if oneof:
                field.oneof_index = 0
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
        for name in messages
    }


@functools.cache
def tf_example() -> type[Message]:
    """The ``tf.train.Example`` message class (TensorFlow's ``example.proto``/``feature.proto``).

    Example:
        >>> from easyfit.data.protos import tf_example
        >>> Example = tf_example()
        >>> ex = Example()
        >>> ex.features.feature["label"].int64_list.value.append(7)
        >>> Example.FromString(ex.SerializeToString()).features.feature["label"].int64_list.value[0]
        7
    """
    messages = build_messages(
        "easyfit/tf_example.proto",
        "tensorflow",
        {
            "BytesList": [("value", 1, "BYTES", "repeated", None)],
            "FloatList": [("value", 1, "FLOAT", "packed", None)],
            "Int64List": [("value", 1, "INT64", "packed", None)],
            "Feature": [
                ("bytes_list", 1, "MESSAGE", "optional", "BytesList"),
                ("float_list", 2, "MESSAGE", "optional", "FloatList"),
                ("int64_list", 3, "MESSAGE", "optional", "Int64List"),
            ],
            "Features": [("feature", 1, "MESSAGE", "map", "Feature")],
            "Example": [("features", 1, "MESSAGE", "optional", "Features")],
        },
        syntax="proto3",
        oneofs={"Feature": "kind"},
    )
    return messages["Example"]


@functools.cache
def caffe2_messages() -> dict:
    """Caffe2's ``TensorProto`` and ``TensorProtos`` message classes (caffe2.proto), by name.

    Example:
        >>> from easyfit.data.protos import caffe2_messages
        >>> m = caffe2_messages()
        >>> label = m["TensorProto"](data_type=2, int32_data=[7])
        >>> m["TensorProtos"].FromString(m["TensorProtos"](protos=[label]).SerializeToString()
        ...                              ).protos[0].int32_data[0]
        7
    """
    return build_messages(
        "easyfit/caffe2.proto",
        "caffe2",
        {
            "TensorProto": [
                ("dims", 1, "INT64", "repeated", None),
                ("data_type", 2, "INT32", "optional", None),
                ("float_data", 3, "FLOAT", "packed", None),
                ("int32_data", 4, "INT32", "packed", None),
                ("byte_data", 5, "BYTES", "optional", None),
                ("string_data", 6, "BYTES", "repeated", None),
            ],
            "TensorProtos": [("protos", 1, "MESSAGE", "repeated", "TensorProto")],
        },
    )
