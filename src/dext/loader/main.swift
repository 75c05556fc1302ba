// MelonDMA loader: asks sysextd to activate or deactivate the driver extension this app carries
// (Contents/Library/SystemExtensions/<bundle id>.dext) and reports what happened on stdout, one
// fact per line, for people and for scripts/macos, which read the RESULT line:
//   REQUEST: activate|deactivate <dext bundle id>
//   REPLACE: <old version> -> <new version>        (activation over an installed version)
//   NEEDS APPROVAL: <where>                         (the request then waits for the user)
//   RESULT: completed | willCompleteAfterReboot | failed <why>
// Exit status: 0 completed, 3 completes after a reboot, 1 failed, 2 usage.
// Activation requests are only honoured for an app in /Applications signed with
// com.apple.developer.system-extension.install (MelonDMA.entitlements).
//
// Never compiled on the project's Linux machines; see docs/macos.md, "What has been compiled".

import Foundation
import SystemExtensions

enum Status: Int32 {
  case completed = 0
  case failed = 1
  case usage = 2
  case afterReboot = 3
}

func say(_ line: String) {
  print(line)
  fflush(stdout)
}

func finish(_ result: String, _ status: Status) -> Never {
  say("RESULT: \(result)")
  exit(status.rawValue)
}

/// The bundle identifier of the one driver extension inside this app; reading it here keeps the
/// name in one place (the dext's Info.plist, itself checked against src/dext/bundle.env).
func embeddedDextIdentifier() -> String? {
  let dir = Bundle.main.bundleURL.appendingPathComponent("Contents/Library/SystemExtensions")
  let items = (try? FileManager.default.contentsOfDirectory(at: dir, includingPropertiesForKeys: nil)) ?? []
  let dexts = items.filter { $0.pathExtension == "dext" }
  guard dexts.count == 1 else { return nil }
  return Bundle(url: dexts[0])?.bundleIdentifier
}

final class Reporter: NSObject, OSSystemExtensionRequestDelegate {
  func request(
    _ request: OSSystemExtensionRequest, actionForReplacingExtension existing: OSSystemExtensionProperties,
    withExtension ext: OSSystemExtensionProperties
  ) -> OSSystemExtensionRequest.ReplacementAction {
    let old = "\(existing.bundleShortVersion) (\(existing.bundleVersion))"
    let new = "\(ext.bundleShortVersion) (\(ext.bundleVersion))"
    // Re-activating the version that runs starts a second process that resets the card under the
    // first, and sysextd leaves it waiting for a reboot: refuse; bump CFBundleVersion instead.
    if existing.bundleVersion == ext.bundleVersion {
      say("REPLACE: \(old) is already installed; not replacing it with itself")
      return .cancel
    }
    say("REPLACE: \(old) -> \(new)")
    return .replace
  }

  func requestNeedsUserApproval(_ request: OSSystemExtensionRequest) {
    say("NEEDS APPROVAL: System Settings > General > Login Items & Extensions > Driver Extensions")
  }

  func request(_ request: OSSystemExtensionRequest, didFinishWithResult result: OSSystemExtensionRequest.Result) {
    switch result {
    case .completed: finish("completed", .completed)
    case .willCompleteAfterReboot: finish("willCompleteAfterReboot", .afterReboot)
    @unknown default: finish("failed unknown result \(result.rawValue)", .failed)
    }
  }

  func request(_ request: OSSystemExtensionRequest, didFailWithError error: Error) {
    let e = error as NSError
    finish("failed \(e.domain) \(e.code): \(e.localizedDescription)", .failed)
  }
}

func usage() -> Never {
  FileHandle.standardError.write("usage: MelonDMA activate|deactivate [--timeout seconds]\n".data(using: .utf8)!)
  exit(Status.usage.rawValue)
}

var verb = ""
var timeout = 300.0  // the user may need a while to find the approval switch
var args = CommandLine.arguments.dropFirst()
while let arg = args.popFirst() {
  switch arg {
  case "activate", "deactivate": verb = arg
  case "--timeout":
    guard let value = args.popFirst().flatMap(Double.init), value > 0 else { usage() }
    timeout = value
  default: usage()
  }
}
if verb.isEmpty { usage() }

guard let identifier = embeddedDextIdentifier() else {
  finish("failed this app carries no single .dext in Contents/Library/SystemExtensions", .failed)
}
say("REQUEST: \(verb) \(identifier)")
let request =
  verb == "activate"
  ? OSSystemExtensionRequest.activationRequest(forExtensionWithIdentifier: identifier, queue: .main)
  : OSSystemExtensionRequest.deactivationRequest(forExtensionWithIdentifier: identifier, queue: .main)
let reporter = Reporter()
request.delegate = reporter
OSSystemExtensionManager.shared.submitRequest(request)
DispatchQueue.main.asyncAfter(deadline: .now() + timeout) {
  finish("failed no answer within \(Int(timeout)) s (approval pending?)", .failed)
}
dispatchMain()
