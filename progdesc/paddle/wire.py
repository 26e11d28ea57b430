"""Where a malformed protobuf breaks: a walk of the wire format (guided by the message's
descriptor, to enter nested messages) that returns the byte offset of the first field
it cannot read. Used only to word an error; the decoding itself is protobuf's."""
from google.protobuf.descriptor import FieldDescriptor


def _varint(data, pos, end):
    value = shift = 0
    while pos < end and shift < 70:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise IndexError(pos)


def first_bad_offset(data, descriptor, start=0, end=None, depth=0):
    """The offset in `data` of the first field of a `descriptor` message (between `start`
    and `end`) that cannot be read, or None if the walk finds none."""
    end = len(data) if end is None else end
    pos = start
    while pos < end:
        field_start = pos
        try:
            key, pos = _varint(data, pos, end)
            number, wire = key >> 3, key & 7
            if number == 0:
                return field_start
            if wire == 0:
                _, pos = _varint(data, pos, end)
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            elif wire == 2:
                length, pos = _varint(data, pos, end)
                if pos + length > end:
                    return field_start
                field = descriptor.fields_by_number.get(number)
                if (field is not None and field.type == FieldDescriptor.TYPE_MESSAGE
                        and depth < 64):
                    inner = first_bad_offset(data, field.message_type, pos, pos + length,
                                             depth + 1)
                    if inner is not None:
                        return inner
                pos += length
            else:
                return field_start
        except IndexError:
            return field_start
        if pos > end:
            return field_start
    return None
