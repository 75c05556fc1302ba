#!/usr/bin/env python3
"""plist_test.py <repo>: the driver's and the loader's plists are well-formed property lists and
agree with the one list of each fact: bundle names (src/dext/bundle.env), PCI device ids
(the rows of src/dext/driverkit/pci_devices.h, which Start checks too, themselves checked against
pci.ids when installed), and the class
names the operator scripts look for (scripts/macos/probes.sh)."""
import os
import plistlib
import re
import sys

top = sys.argv[1]
problems = []


def check(cond, what):
    if not cond:
        problems.append(what)


def load(rel):
    with open(os.path.join(top, rel), "rb") as f:
        return plistlib.load(f)  # raises on malformed XML: the test fails loudly


env = {}
with open(os.path.join(top, "src/dext/bundle.env")) as f:
    for line in f:
        if "=" in line and not line.startswith("#"):
            k, v = line.strip().split("=", 1)
            env[k] = v

with open(os.path.join(top, "src/dext/driverkit/pci_devices.h")) as f:
    rows = re.findall(r'\{0x([0-9a-fA-F]{4}), 0x([0-9a-fA-F]{4}), "([^"]+)"\}', f.read())
check(bool(rows), "pci_devices.h has no device rows")
check(all(v.lower() == "15b3" for v, _, _ in rows), "pci_devices.h lists a vendor other than 15b3")
table = [(dev.lower(), family) for _, dev, family in rows]
match = [f"0x{dev}15b3" for dev, _ in table]
check(len(set(match)) == len(match), "pci_devices.h repeats a device")

dext = load("src/dext/driverkit/Info.plist")
check(dext.get("CFBundleIdentifier") == env["MLX_DEXT_ID"], "dext CFBundleIdentifier differs from bundle.env")
check(dext.get("CFBundleExecutable") == env["MLX_DEXT_NAME"], "dext CFBundleExecutable differs from bundle.env")
check(dext.get("CFBundlePackageType") == "DEXT", "dext CFBundlePackageType is not DEXT")
pers = dext.get("IOKitPersonalities", {})
check(list(pers) == ["MlxPCIDriver"], f"personalities are {list(pers)}, expected ['MlxPCIDriver']")
p = pers.get("MlxPCIDriver", {})
check(p.get("IOUserServerName") == env["MLX_DEXT_ID"], "IOUserServerName differs from the dext bundle id")
check(p.get("CFBundleIdentifier") == env["MLX_DEXT_ID"], "personality CFBundleIdentifier differs")
check(p.get("IOClass") == "IOUserService", "personality IOClass is not IOUserService")
check(p.get("IOProviderClass") == "IOPCIDevice", "personality IOProviderClass is not IOPCIDevice")
check(p.get("IOPCIMatch", "").split() == match, f"IOPCIMatch {p.get('IOPCIMatch')!r} != table {match}")
check(p.get("IOPCITunnelCompatible") is True, "IOPCITunnelCompatible must be true (Thunderbolt enclosures)")
check(isinstance(p.get("IOProbeScore"), int) and p["IOProbeScore"] > 1000, "IOProbeScore must beat Apple's 1000")
uc = p.get("MlxUserClientProperties", {})
check(uc.get("IOClass") == "IOUserUserClient", "user client IOClass is not IOUserUserClient")
check("com.apple.developer.driverkit.userclient-access" in uc.get("IOServiceDEXTEntitlements", []),
      "user client does not require userclient-access")

# The declared DriverKit version covers the newest call the glue makes (Apple's availability:
# IOPCIDevice::ConfigureInterrupts came with macOS 12.3, DriverKit 21.4). Both libraries alike.
MIN_DRIVERKIT = {"ConfigureInterrupts": (21, 4)}
libs = dext.get("OSBundleLibraries", {})
declared = libs.get("com.apple.DriverKit", "0")
check(libs.get("com.apple.driverkit-family.ApplePCIDriverKit") == declared,
      "ApplePCIDriverKit's version differs from DriverKit's")
have = tuple(int(x) for x in declared.split("."))
glue = ""
for name in sorted(os.listdir(os.path.join(top, "src/dext/driverkit"))):
    if name.endswith(".cpp"):
        with open(os.path.join(top, "src/dext/driverkit", name)) as f:
            glue += f.read()
for call, need in MIN_DRIVERKIT.items():
    if re.search(r"\b" + call + r"\(", glue):
        check(have >= need, f"the glue calls {call} (DriverKit {need[0]}.{need[1]}) but Info.plist declares {declared}")

ent = load("src/dext/driverkit/MlxRDMA.entitlements")
check(ent.get("com.apple.developer.driverkit") is True, "dext lacks com.apple.developer.driverkit")
pci = ent.get("com.apple.developer.driverkit.transport.pci", [])
check(len(pci) == 1 and pci[0].get("IOPCIMatch", "").split() == match, "transport.pci IOPCIMatch != table")
check("com.apple.developer.driverkit.allow-any-userclient-access" not in ent,
      "allow-any-userclient-access must not be in the driver's entitlements")

app = load("src/dext/loader/Info.plist")
check(app.get("CFBundleIdentifier") == env["MLX_APP_ID"], "loader CFBundleIdentifier differs from bundle.env")
check(app.get("CFBundleExecutable") == env["MLX_APP_NAME"], "loader CFBundleExecutable differs from bundle.env")
check(app.get("CFBundlePackageType") == "APPL", "loader is not an APPL")
aent = load("src/dext/loader/MelonDMA.entitlements")
check(aent.get("com.apple.developer.system-extension.install") is True, "loader lacks system-extension.install")
check(aent.get("com.apple.developer.driverkit.userclient-access") == [env["MLX_DEXT_ID"]],
      "loader's userclient-access must name exactly the dext bundle id")

# The operator scripts find the driver and its clients by these class names.
with open(os.path.join(top, "scripts/macos/probes.sh")) as f:
    probes = f.read()
check(re.search(r"^OUR_CLASS=(\S+)", probes, re.M).group(1) == p.get("IOUserClass"), "probes.sh OUR_CLASS != IOUserClass")
check(re.search(r"^OUR_CLIENT_CLASS=(\S+)", probes, re.M).group(1) == uc.get("IOUserClass"),
      "probes.sh OUR_CLIENT_CLASS != the user client's IOUserClass")

# An independent oracle for the table: the PCI ID repository as Debian ships it.
ids_path = "/usr/share/misc/pci.ids"
if os.path.exists(ids_path):
    names, in_vendor = {}, False
    with open(ids_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if re.match(r"^[0-9a-f]{4}\s", line):
                in_vendor = line.startswith("15b3 ")
            elif in_vendor and re.match(r"^\t[0-9a-f]{4}\s", line):
                dev, name = line.strip().split(None, 1)
                names[dev] = name
    for dev, family in table:
        name = names.get(dev, "")
        check(f"[{family}]" in name, f"pci.ids names 15b3:{dev} {name!r}, table says {family}")
        check("Virtual Function" not in name, f"15b3:{dev} is a virtual function")
else:
    print("note: no pci.ids; the device table was not cross-checked")

for msg in problems:
    print("FAIL:", msg)
if problems:
    sys.exit(1)
print(f"PASS: 4 plists, {len(table)} devices")
