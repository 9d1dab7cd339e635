// Why work stopped executing.
package android.hardware.npu;

@VintfStability
@Backing(type="int")
enum EndReason {
    CANCELLED_USER = 0,
    CANCELLED_SYSTEM = 1,
    PAUSED = 2,
    FAILED = 3,
    COMPLETED = 4,
}
