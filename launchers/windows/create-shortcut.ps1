# Create (or replace) a Windows shortcut (.lnk) that runs the aitk launcher.
# Called by `python3 -m manager shortcut`; usable by hand too:
#   powershell -NoProfile -ExecutionPolicy Bypass -File create-shortcut.ps1 `
#       -ShortcutPath "$HOME\Desktop\aitk.lnk" -Target C:\aitk\launchers\windows\aitk.bat `
#       -WorkingDirectory C:\aitk
param(
    [Parameter(Mandatory = $true)] [string] $ShortcutPath,
    [Parameter(Mandatory = $true)] [string] $Target,
    [Parameter(Mandatory = $true)] [string] $WorkingDirectory,
    [string] $Description = 'Update and start the aitk toolkit'
)
$ErrorActionPreference = 'Stop'
$shell = New-Object -ComObject WScript.Shell
$link = $shell.CreateShortcut($ShortcutPath)
$link.TargetPath = $Target
$link.WorkingDirectory = $WorkingDirectory
$link.Description = $Description
$link.WindowStyle = 1
$link.Save()
Write-Output $ShortcutPath
