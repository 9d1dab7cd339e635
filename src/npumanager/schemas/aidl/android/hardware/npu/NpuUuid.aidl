// A 128-bit identifier in RFC 4122 byte order.
package android.hardware.npu;

@VintfStability
@FixedSize
parcelable NpuUuid {
    byte[16] value;
}
