// Why work started executing.
package android.hardware.npu;

@VintfStability
@Backing(type="int")
enum StartReason {
    INITIAL = 0,
    RESUMED = 1,
}
